//! A deadline timer on a `timerfd`: one wake-up per deadline, to the nanosecond.
//!
//! tokio's own timer ([`tokio::time::sleep_until`]) keeps its deadlines in a hierarchical wheel
//! of millisecond slots, 64 to a level: a deadline in the next 64 ms block wakes the thread at
//! the block's boundary to move it down a level, then again at the deadline, and the driver's
//! rounding adds wake-ups of a millisecond or less. A loop that rearms a timer every 20 to 80 ms
//! (the owner watch's heartbeats, the gossip's probes) paid for a third to a half of its
//! wake-ups that way, with nothing to do in them (`swimlb-lab soak --threads`, and `strace` of
//! the thread: an `epoll_wait` that times out only to wait again). A `timerfd` armed for the
//! deadline wakes the thread once, at it.
//!
//! Where the system gives no `timerfd`, tokio's timer does the job as before.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use nix::errno::Errno;
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

/// The timerfd, for [`AsyncFd`] (which wants [`AsRawFd`]).
#[derive(Debug)]
struct Fd(TimerFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// One deadline at a time, for a task's `select!` loop (see the module docs). Must be created
/// and used within a tokio runtime.
#[derive(Debug)]
pub struct Deadline {
    fd: Option<AsyncFd<Fd>>,
    /// The deadline the timerfd is armed for.
    armed: Option<Instant>,
}

impl Deadline {
    /// A timer on a new `timerfd`, or on tokio's timer when the system gives none.
    pub fn new() -> Deadline {
        let fd = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .map_err(std::io::Error::from)
        .and_then(|fd| {
            // SAFETY: `Fd` owns the timerfd, which stays open, the same descriptor, until the
            // `AsyncFd` (its only owner) is dropped.
            #[allow(unsafe_code)]
            let registered = unsafe { AsyncFd::register_with_interest(Fd(fd), Interest::READABLE) };
            registered.map_err(std::io::Error::from)
        });
        match fd {
            Ok(fd) => Deadline {
                fd: Some(fd),
                armed: None,
            },
            Err(e) => {
                tracing::debug!(error = %e, "no timerfd: tokio's timer instead");
                Deadline {
                    fd: None,
                    armed: None,
                }
            }
        }
    }

    /// Resolves at `at` (at once if it is past). Cancel-safe: a future dropped before `at`
    /// leaves the timer armed, and the next call for the same deadline waits for it.
    pub async fn sleep_until(&mut self, at: Instant) {
        let Some(fd) = &self.fd else {
            return tokio::time::sleep_until(at).await;
        };
        let now = Instant::now();
        if at <= now {
            self.armed = None;
            return;
        }
        if self.armed != Some(at) {
            // A relative one-shot: the clock is the same as `Instant`'s, but `Instant` does not
            // give its raw value.
            let expiration = Expiration::OneShot(TimeSpec::from_duration(at - now));
            if let Err(e) = fd.get_ref().0.set(expiration, TimerSetTimeFlags::empty()) {
                tracing::debug!(error = %e, "timerfd_settime: tokio's timer instead");
                return tokio::time::sleep_until(at).await;
            }
            self.armed = Some(at);
        }
        loop {
            let Ok(mut ready) = fd.readable().await else {
                return tokio::time::sleep_until(at).await;
            };
            // Reading the count of expirations clears it; nothing to read yet (a readiness
            // left from an earlier deadline) waits again.
            match ready.try_io(|fd| match fd.get_ref().0.wait() {
                Ok(()) => Ok(()),
                Err(Errno::EAGAIN) => Err(std::io::ErrorKind::WouldBlock.into()),
                Err(e) => Err(e.into()),
            }) {
                Ok(Ok(())) => {
                    self.armed = None;
                    return;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "timerfd read: tokio's timer instead");
                    return tokio::time::sleep_until(at).await;
                }
                Err(_would_block) => {}
            }
        }
    }
}

impl Default for Deadline {
    fn default() -> Deadline {
        Deadline::new()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn it_resolves_at_its_deadline_not_before_and_can_be_rearmed_earlier() {
        let mut timer = Deadline::new();
        assert!(timer.fd.is_some(), "Linux gives a timerfd");
        let start = Instant::now();
        let at = start + Duration::from_millis(30);
        timer.sleep_until(at).await;
        assert!(Instant::now() >= at);
        // Armed for later, abandoned, then asked for an earlier deadline: the earlier one.
        let late = Instant::now() + Duration::from_secs(3600);
        let abandoned = tokio::time::timeout(Duration::from_millis(5), timer.sleep_until(late));
        assert!(abandoned.await.is_err());
        let soon = Instant::now() + Duration::from_millis(10);
        tokio::time::timeout(Duration::from_secs(10), timer.sleep_until(soon))
            .await
            .expect("the earlier deadline fires");
        assert!(Instant::now() >= soon);
        // A deadline already past resolves at once.
        tokio::time::timeout(Duration::from_secs(10), timer.sleep_until(start))
            .await
            .expect("a past deadline resolves at once");
    }

    #[tokio::test]
    async fn a_deadline_left_armed_and_asked_for_again_still_fires() {
        let mut timer = Deadline::new();
        let at = Instant::now() + Duration::from_millis(20);
        let first = tokio::time::timeout(Duration::from_millis(2), timer.sleep_until(at));
        assert!(first.await.is_err(), "not before its deadline");
        tokio::time::timeout(Duration::from_secs(10), timer.sleep_until(at))
            .await
            .expect("the same deadline fires");
        assert!(Instant::now() >= at);
    }
}
