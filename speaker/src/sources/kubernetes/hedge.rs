//! Hedged requests: an idempotent request still unanswered after a while is sent again beside
//! the first, and the first answer that succeeds is taken ([`hedged`]).
//!
//! A request on a lossy link waits out TCP's retransmission timeouts: at least 200 ms for a
//! lost segment of an open connection, then twice as long for each loss after; 1 s, then 3 s,
//! for the lost handshake of a new one (a node that just started, or whose pooled connection
//! timed out, opens one for its first write). In one 1,800 s chaos run with loss bursts of
//! 5-20 %, 18 record writes took 0.5 s or more, 7 of them over 2 s (up to 3.0 s): mostly
//! waiting. A copy goes out on another connection (the first one is busy), so its losses are
//! its own.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tokio::time::{Instant, sleep_until};

/// When a record's write is sent again, counted from its start, while no attempt answered:
/// twice the shortest retransmission timeout, then once the first copy had as long.
pub const RECORD_HEDGES: [Duration; 2] = [Duration::from_millis(400), Duration::from_millis(1200)];

/// How many copies of record writes one speaker has in flight at most, whatever the number of
/// writes: against an API server slow for everyone (not a lossy link) every write would be
/// copied, twice; with this bound the copies add at most this many requests to the 8 writes a
/// flush has in flight.
pub const RECORD_COPIES_IN_FLIGHT: usize = 2;

/// Runs `first`, and a copy (`copy()`; `None`: none may go now) at each of `hedges` (since the
/// start) while none has answered: the first success is returned and the others are dropped.
/// An attempt that fails lets the others go on; once every attempt started has failed, the
/// last error is returned at once (no further copy is sent: the caller's retry decides what a
/// failure means). The request must be idempotent, as a forced server-side apply is.
pub async fn hedged<T, E, F>(
    hedges: &[Duration],
    first: F,
    copy: impl Fn() -> Option<F>,
) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    let mut copies = hedges.iter().map(|after| start + *after);
    let mut next = copies.next();
    let mut running = FuturesUnordered::new();
    running.push(first);
    loop {
        tokio::select! {
            // Never empty here: an answer that leaves none running returns.
            Some(answer) = running.next() => {
                if answer.is_ok() || running.is_empty() {
                    return answer;
                }
            }
            () = sleep_until(next.unwrap_or(start)), if next.is_some() => {
                running.extend(copy());
                next = copies.next();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const HEDGES: [Duration; 2] = [Duration::from_millis(400), Duration::from_millis(1200)];

    /// Attempt number `sent` (counted): `plan[sent]`'s answer after its wait.
    async fn answers(
        sent: &Cell<u32>,
        plan: &[(Duration, Result<u32, &'static str>)],
    ) -> Result<u32, &'static str> {
        let n = sent.get();
        sent.set(n + 1);
        let (after, answer) = plan[n as usize];
        tokio::time::sleep(after).await;
        answer
    }

    /// [`hedged`] with `plan`, every copy let go.
    async fn copied(
        sent: &Cell<u32>,
        plan: &[(Duration, Result<u32, &'static str>)],
    ) -> Result<u32, &'static str> {
        hedged(&HEDGES, answers(sent, plan), || Some(answers(sent, plan))).await
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn a_quick_answer_sends_no_copy() {
        let sent = Cell::new(0);
        let plan = [(ms(30), Ok(1))];
        let start = Instant::now();
        assert_eq!(copied(&sent, &plan).await, Ok(1));
        assert_eq!((sent.get(), start.elapsed()), (1, ms(30)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stuck_attempt_is_overtaken_by_its_copy() {
        let sent = Cell::new(0);
        // The first waits out a lost handshake (3 s); the copy sent at 400 ms answers in 20.
        let plan = [(ms(3000), Ok(1)), (ms(20), Ok(2))];
        let start = Instant::now();
        assert_eq!(copied(&sent, &plan).await, Ok(2));
        assert_eq!((sent.get(), start.elapsed()), (2, ms(420)));
    }

    #[tokio::test(start_paused = true)]
    async fn copies_go_out_at_each_hedge_until_one_answers() {
        let sent = Cell::new(0);
        let plan = [(ms(5000), Ok(1)), (ms(5000), Ok(2)), (ms(100), Ok(3))];
        let start = Instant::now();
        assert_eq!(copied(&sent, &plan).await, Ok(3));
        assert_eq!((sent.get(), start.elapsed()), (3, ms(1300)));
    }

    #[tokio::test(start_paused = true)]
    async fn without_leave_for_a_copy_the_first_attempt_goes_on_alone() {
        let sent = Cell::new(0);
        let plan = [(ms(3000), Ok(1))];
        let start = Instant::now();
        assert_eq!(hedged(&HEDGES, answers(&sent, &plan), || None).await, Ok(1));
        assert_eq!((sent.get(), start.elapsed()), (1, ms(3000)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_waits_for_the_copies_still_running() {
        let sent = Cell::new(0);
        let plan = [(ms(600), Err("reset")), (ms(700), Ok(2))];
        let start = Instant::now();
        assert_eq!(copied(&sent, &plan).await, Ok(2));
        assert_eq!((sent.get(), start.elapsed()), (2, ms(1100)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_with_nothing_left_running_is_returned_at_once() {
        let sent = Cell::new(0);
        // The API server is away: refused at once, no copy follows.
        let plan = [(ms(1), Err("refused"))];
        let start = Instant::now();
        assert_eq!(copied(&sent, &plan).await, Err("refused"));
        assert_eq!((sent.get(), start.elapsed()), (1, ms(1)));
        // Every copy failed: the last error.
        let sent = Cell::new(0);
        let plan = [(ms(500), Err("first")), (ms(300), Err("second"))];
        assert_eq!(copied(&sent, &plan).await, Err("second"));
        assert_eq!(sent.get(), 2);
    }
}
