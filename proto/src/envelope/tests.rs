//! The envelope's tests: round trips, every refusal, the golden vectors of Python
//! `cryptography`, and the receiver binding of version 3.

use super::*;

const K1: [u8; 32] = [0x11; 32];
const K2: [u8; 32] = [0x22; 32];

fn sealed(ring: &KeyRing, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    ring.seal(payload, &mut out).unwrap();
    out
}

#[test]
fn seal_then_open_returns_the_payload() {
    let ring = KeyRing::new("edge-1", &[K1]).unwrap();
    let mut d = sealed(&ring, b"hello gossip");
    assert_eq!(d.len(), OVERHEAD_V2 + 12);
    assert_eq!(&d[..4], b"swlb");
    assert_eq!(d[4], 2);
    assert_eq!(ring.open(&mut d).unwrap(), b"hello gossip");
}

#[test]
fn a_duplicate_ring_opens_and_seals_alike_under_another_anonymous_stream() {
    let ring = KeyRing::new("edge-1", &[K1, K2]).unwrap();
    let twin = ring.duplicate().unwrap();
    assert_eq!(twin.cluster(), ring.cluster());
    assert_eq!(
        twin.key_ids().collect::<Vec<_>>(),
        ring.key_ids().collect::<Vec<_>>()
    );
    let mut d = sealed(&twin, b"watch");
    assert_eq!(ring.open(&mut d).unwrap(), b"watch");
    let (a, b) = (sealed(&ring, b"x"), sealed(&twin, b"x"));
    assert_ne!(
        open_sequence(&a).sender,
        open_sequence(&b).sender,
        "the anonymous streams differ"
    );
}

fn open_sequence(d: &[u8]) -> Sequence {
    sequence_of(&d[..HEADER_LEN])
}

#[test]
fn empty_payload_round_trips() {
    let ring = KeyRing::new("edge-1", &[K1]).unwrap();
    let mut d = sealed(&ring, b"");
    assert_eq!(ring.open(&mut d).unwrap(), b"");
}

#[test]
fn key_id_comes_from_material_not_position() {
    let a = KeyRing::new("c", &[K1, K2]).unwrap();
    let b = KeyRing::new("c", &[K2, K1]).unwrap();
    assert_eq!(
        a.key_ids().collect::<Vec<_>>()[0],
        b.key_ids().collect::<Vec<_>>()[1]
    );
    // b seals with K2, a still opens it.
    let mut d = sealed(&b, b"rotating");
    assert_eq!(a.open(&mut d).unwrap(), b"rotating");
    // a seals with K1, b opens it too.
    let mut d = sealed(&a, b"rotating");
    assert_eq!(b.open(&mut d).unwrap(), b"rotating");
}

#[test]
fn seal_with_picks_a_key_of_the_ring_and_refuses_others() {
    let new_first = KeyRing::new("c", &[K2, K1]).unwrap();
    let old_only = KeyRing::new("c", &[K1]).unwrap();
    assert!(new_first.has_key(KeyId::of(&K1)));
    assert!(!old_only.has_key(KeyId::of(&K2)));
    let mut d = Vec::new();
    new_first
        .seal_with(KeyId::of(&K1), b"to an old peer", &mut d)
        .unwrap();
    assert_eq!(KeyRing::peek_key_id(&d), Ok(KeyId::of(&K1)));
    assert_eq!(old_only.open(&mut d).unwrap(), b"to an old peer");
    let mut out = vec![9];
    assert_eq!(
        old_only.seal_with(KeyId::of(&K2), b"x", &mut out),
        Err(Error::UnknownKey(KeyId::of(&K2).0))
    );
    assert_eq!(
        old_only.seal_with(KeyId::of(&K1), &[0; MAX_PAYLOAD_LEN + 1], &mut out),
        Err(Error::TooLarge)
    );
    assert_eq!(out, vec![9], "a refused seal leaves the output alone");
}

#[test]
fn known_key_id_vector() {
    // SHA-256("swimlb key id" || 0x11 * 32), first four bytes; computed with
    // `python3 -c "import hashlib;print(hashlib.sha256(b'swimlb key id'+b'\x11'*32).hexdigest()[:8])"`.
    assert_eq!(KeyId::of(&K1).to_string(), "4dbf27ca");
}

#[test]
fn unknown_key_is_rejected_with_its_id() {
    let sender = KeyRing::new("c", &[K2]).unwrap();
    let receiver = KeyRing::new("c", &[K1]).unwrap();
    let mut d = sealed(&sender, b"x");
    assert_eq!(
        receiver.open(&mut d),
        Err(Error::UnknownKey(KeyId::of(&K2).0))
    );
}

#[test]
fn other_cluster_name_fails_authentication() {
    let sender = KeyRing::new("edge-1", &[K1]).unwrap();
    let receiver = KeyRing::new("edge-2", &[K1]).unwrap();
    let mut d = sealed(&sender, b"x");
    assert_eq!(receiver.open(&mut d), Err(Error::AuthenticationFailed));
}

#[test]
fn flipped_ciphertext_bit_fails_authentication() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let mut d = sealed(&ring, b"payload");
    d[HEADER_LEN] ^= 1;
    assert_eq!(ring.open(&mut d), Err(Error::AuthenticationFailed));
}

#[test]
fn flipped_nonce_bit_fails_authentication() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let mut d = sealed(&ring, b"payload");
    d[field::NONCE.start] ^= 0x80;
    assert_eq!(ring.open(&mut d), Err(Error::AuthenticationFailed));
}

#[test]
fn flipped_tag_bit_fails_authentication() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let mut d = sealed(&ring, b"payload");
    let last = d.len() - 1;
    d[last] ^= 1;
    assert_eq!(ring.open(&mut d), Err(Error::AuthenticationFailed));
}

#[test]
fn wrong_magic_is_rejected() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let mut d = sealed(&ring, b"payload");
    d[0] = b'S';
    assert_eq!(ring.open(&mut d), Err(Error::WrongMagic));
}

#[test]
fn unsupported_version_is_rejected() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    // Version 1 (the envelope without a sequence) and any later version.
    for version in [0, 1, 4, 0xff] {
        let mut d = sealed(&ring, b"payload");
        d[4] = version;
        assert_eq!(ring.open(&mut d), Err(Error::UnsupportedVersion(version)));
    }
}

#[test]
fn datagram_shorter_than_overhead_is_truncated() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let d = sealed(&ring, b"");
    for len in 0..OVERHEAD_V2 {
        let mut short = d[..len].to_vec();
        assert_eq!(ring.open(&mut short), Err(Error::Truncated), "length {len}");
    }
}

#[test]
fn oversized_datagram_is_rejected_before_magic() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let mut d = vec![0u8; MAX_DATAGRAM_LEN + 1];
    assert_eq!(ring.open(&mut d), Err(Error::TooLarge));
}

#[test]
fn oversized_payload_is_refused_and_output_untouched() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let mut out = vec![7u8];
    assert_eq!(
        ring.seal(&vec![0; MAX_PAYLOAD_LEN + 1], &mut out),
        Err(Error::TooLarge)
    );
    assert_eq!(out, vec![7u8]);
    ring.seal(&vec![0; MAX_PAYLOAD_LEN], &mut out).unwrap();
    assert_eq!(out.len(), 1 + MAX_DATAGRAM_LEN - RECEIVER_LEN);
    let mut stream = SealStream::new(1, 1).unwrap();
    let mut v3 = Vec::new();
    let to = Addressing::V3 { receiver: 2 };
    ring.seal_to(&mut stream, None, to, &vec![0; MAX_PAYLOAD_LEN], &mut v3)
        .unwrap();
    assert_eq!(
        v3.len(),
        MAX_DATAGRAM_LEN,
        "the largest version-3 envelope fits"
    );
}

#[test]
fn nonces_do_not_repeat() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let a = sealed(&ring, b"same");
    let b = sealed(&ring, b"same");
    assert_ne!(a[field::NONCE], b[field::NONCE]);
    assert_ne!(a[HEADER_LEN..], b[HEADER_LEN..]);
}

#[test]
fn invalid_rings_are_refused() {
    assert_eq!(
        KeyRing::new("c", &[]).unwrap_err(),
        Error::InvalidKeyRing("no key")
    );
    assert_eq!(
        KeyRing::new("c", &[K1, K1]).unwrap_err(),
        Error::InvalidKeyRing("duplicate key")
    );
    assert!(KeyRing::new("", &[K1]).is_err());
    assert!(KeyRing::new(&"a".repeat(254), &[K1]).is_err());
    assert!(KeyRing::new(&"a".repeat(253), &[K1]).is_ok());
}

/// The sequence and salt of `crate::golden::ENVELOPE`.
const GOLDEN_SEQUENCE: Sequence = Sequence {
    sender: 0x2021_2223_2425_2627,
    epoch: 1_700_000_000_000,
    counter: 0x0405_0607_0809_0a0b,
};
const GOLDEN_SALT: [u8; 4] = [0, 1, 2, 3];

#[test]
fn seal_with_a_fixed_sequence_matches_python_cryptography() {
    // `crate::golden::ENVELOPE` was sealed by Python `cryptography`'s AESGCM (see its doc).
    let ring = KeyRing::new("edge-1", &[K1]).unwrap();
    let mut out = Vec::new();
    ring.seal_fixed(
        Addressing::V2,
        GOLDEN_SEQUENCE,
        GOLDEN_SALT,
        b"hello gossip",
        &mut out,
    )
    .unwrap();
    assert_eq!(out, crate::golden::ENVELOPE);
}

#[test]
fn envelope_sealed_by_python_cryptography_opens_with_its_sequence() {
    let ring = KeyRing::new("edge-1", &[K1]).unwrap();
    let mut d = crate::golden::ENVELOPE;
    let opened = ring.open_envelope(&mut d).unwrap();
    assert_eq!(opened.payload, b"hello gossip");
    assert_eq!(opened.sequence, GOLDEN_SEQUENCE);
    assert_eq!(opened.key_id, KeyId::of(&K1));
}

#[test]
fn a_stream_numbers_its_envelopes_one_by_one_across_key_rings() {
    let first = KeyRing::new("c", &[K1]).unwrap();
    let rotated = KeyRing::new("c", &[K2, K1]).unwrap();
    let mut stream = SealStream::new(7, 1_700_000_000_000).unwrap();
    let start = stream.peek().counter;
    assert!(start < COUNTER_START_BOUND);
    let mut seen = Vec::new();
    for (ring, key) in [
        (&first, None),
        (&rotated, None),
        (&rotated, Some(KeyId::of(&K1))),
    ] {
        let mut d = Vec::new();
        ring.seal_in(&mut stream, key, b"x", &mut d).unwrap();
        let opened = rotated.open_envelope(&mut d).unwrap();
        assert_eq!(
            (opened.sequence.sender, opened.sequence.epoch),
            (7, 1_700_000_000_000)
        );
        seen.push(opened.sequence.counter);
    }
    assert_eq!(seen, vec![start, start + 1, start + 2]);
}

#[test]
fn a_refused_seal_leaves_the_stream_and_the_output_alone() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let mut stream = SealStream::new(1, 1).unwrap();
    let before = stream.peek();
    let mut out = vec![5];
    assert_eq!(
        ring.seal_in(&mut stream, Some(KeyId::of(&K2)), b"x", &mut out),
        Err(Error::UnknownKey(KeyId::of(&K2).0))
    );
    assert_eq!(
        ring.seal_in(&mut stream, None, &[0; MAX_PAYLOAD_LEN + 1], &mut out),
        Err(Error::TooLarge)
    );
    stream.next = u64::MAX;
    assert!(matches!(
        ring.seal_in(&mut stream, None, b"x", &mut out),
        Err(Error::OutOfRange(_))
    ));
    assert_eq!(stream.peek().counter, u64::MAX);
    stream.next = before.counter;
    assert_eq!(stream.peek(), before);
    assert_eq!(out, vec![5]);
}

#[test]
fn streams_of_one_sender_and_epoch_never_share_a_nonce() {
    // Two streams made for the same sender and epoch (a restart within one millisecond, a
    // misconfigured bump) still draw their own salts and counter starts.
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let mut a = SealStream::new(1, 1).unwrap();
    let mut b = SealStream::new(1, 1).unwrap();
    let (mut da, mut db) = (Vec::new(), Vec::new());
    ring.seal_in(&mut a, None, b"same", &mut da).unwrap();
    ring.seal_in(&mut b, None, b"same", &mut db).unwrap();
    assert_ne!(da[field::NONCE], db[field::NONCE]);
}

#[test]
fn altered_sequence_fails_authentication() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    for byte in [
        field::SENDER.start,
        field::EPOCH.end - 1,
        field::COUNTER.end - 1,
    ] {
        let mut d = sealed(&ring, b"payload");
        d[byte] ^= 1;
        assert_eq!(
            ring.open(&mut d),
            Err(Error::AuthenticationFailed),
            "byte {byte}"
        );
    }
}

#[test]
fn anonymous_seals_count_up_under_one_random_sender_in_epoch_zero() {
    let ring = KeyRing::new("c", &[K1, K2]).unwrap();
    let mut a = sealed(&ring, b"a");
    let mut b = Vec::new();
    ring.seal_with(KeyId::of(&K2), b"b", &mut b).unwrap();
    let a = ring.open_envelope(&mut a).unwrap().sequence;
    let b = ring.open_envelope(&mut b).unwrap().sequence;
    assert_eq!((a.sender, a.epoch), (b.sender, 0));
    assert_eq!(b.counter, a.counter + 1);
    let other = KeyRing::new("c", &[K1]).unwrap();
    let mut c = sealed(&other, b"c");
    assert_ne!(
        other.open_envelope(&mut c).unwrap().sequence.sender,
        a.sender
    );
}

/// `AESGCM(b"\x11" * 32).encrypt(bytes(range(12)), b"hello gossip", header + b"edge-1")`
/// with `header = b"swlb" + b"\x03" + sha256(b"swimlb key id" + b"\x11" * 32)[:4] + sender +
/// epoch + bytes(range(12)) + receiver`, `sender = bytes(range(0x20, 0x28))`, `epoch =
/// (1700000000000).to_bytes(8, "big")`, `receiver = bytes(range(0x30, 0x38))`: computed with
/// Python `cryptography` 48, not with this crate.
const GOLDEN_V3: [u8; 73] = [
    0x73, 0x77, 0x6c, 0x62, 0x03, 0x4d, 0xbf, 0x27, 0xca, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26,
    0x27, 0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06,
    0x07, 0x08, 0x09, 0x0a, 0x0b, 0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x7b, 0x86, 0xda,
    0x7f, 0x14, 0x83, 0x52, 0x9b, 0x67, 0xcb, 0xba, 0xef, 0x4e, 0x21, 0xf3, 0x63, 0x83, 0xa4, 0x10,
    0x75, 0xfb, 0x68, 0xd0, 0x23, 0xf1, 0xc2, 0x12, 0x9b,
];
const GOLDEN_RECEIVER: u64 = 0x3031_3233_3435_3637;

#[test]
fn version_three_matches_python_cryptography_and_opens_only_at_its_receiver() {
    let ring = KeyRing::new("edge-1", &[K1]).unwrap();
    let to = Addressing::V3 {
        receiver: GOLDEN_RECEIVER,
    };
    let mut out = Vec::new();
    ring.seal_fixed(to, GOLDEN_SEQUENCE, GOLDEN_SALT, b"hello gossip", &mut out)
        .unwrap();
    assert_eq!(out, GOLDEN_V3);
    assert_eq!(out.len(), OVERHEAD + 12, "eight bytes more than version 2");
    let mut d = GOLDEN_V3;
    let opened = ring
        .open_for(&mut d, GOLDEN_RECEIVER, Versions::THIS_BUILD)
        .unwrap();
    assert_eq!(opened.payload, b"hello gossip");
    assert_eq!(
        (opened.version, opened.receiver, opened.sequence),
        (3, Some(GOLDEN_RECEIVER), GOLDEN_SEQUENCE)
    );
    let mut d = GOLDEN_V3;
    assert_eq!(
        ring.open_for(&mut d, GOLDEN_RECEIVER + 1, Versions::THIS_BUILD),
        Err(Error::WrongReceiver)
    );
}

fn sealed_to(ring: &KeyRing, to: Addressing, payload: &[u8]) -> Vec<u8> {
    let mut stream = SealStream::new(1, 1).unwrap();
    let mut out = Vec::new();
    ring.seal_to(&mut stream, None, to, payload, &mut out)
        .unwrap();
    out
}

#[test]
fn a_version_three_envelope_captured_for_one_receiver_fails_at_another() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let (a, b) = (0xaaaa_u64, 0xbbbb_u64);
    let d = sealed_to(&ring, Addressing::V3 { receiver: a }, b"for a");
    assert_eq!(d[field::VERSION], 3);
    let mut at_a = d.clone();
    assert_eq!(
        ring.open_for(&mut at_a, a, Versions::THIS_BUILD)
            .unwrap()
            .payload,
        b"for a"
    );
    // Replayed as it is to b: refused before any cryptography, and told apart.
    let mut at_b = d.clone();
    assert_eq!(
        ring.open_for(&mut at_b, b, Versions::THIS_BUILD),
        Err(Error::WrongReceiver)
    );
    // Its receiver rewritten to b: the receiver is authenticated.
    let mut forged = d.clone();
    forged[field::RECEIVER].copy_from_slice(&b.to_be_bytes());
    assert_eq!(
        ring.open_for(&mut forged, b, Versions::THIS_BUILD),
        Err(Error::AuthenticationFailed)
    );
    // Relabelled as version 2 (to shed the receiver): the header is authenticated too.
    let mut relabelled = d.clone();
    relabelled[field::VERSION] = 2;
    assert_eq!(
        ring.open_for(&mut relabelled, b, Versions::THIS_BUILD),
        Err(Error::AuthenticationFailed)
    );
}

#[test]
fn version_two_still_opens_anywhere_and_the_previous_behaviour_refuses_three() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let v2 = sealed_to(&ring, Addressing::V2, b"old");
    assert_eq!((v2[field::VERSION], v2.len()), (2, OVERHEAD_V2 + 3));
    for me in [1, 2, u64::MAX] {
        for accepted in [Versions::THIS_BUILD, Versions::PREVIOUS] {
            let mut d = v2.clone();
            let opened = ring.open_for(&mut d, me, accepted).unwrap();
            assert_eq!((opened.payload, opened.version), (&b"old"[..], 2));
            assert_eq!(opened.receiver, None);
        }
    }
    let mut v3 = sealed_to(&ring, Addressing::V3 { receiver: 1 }, b"new");
    assert_eq!(
        ring.open_for(&mut v3, 1, Versions::PREVIOUS),
        Err(Error::UnsupportedVersion(3)),
        "as the previous release does"
    );
}

#[test]
fn a_version_three_header_cut_short_is_truncated() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let d = sealed_to(&ring, Addressing::V3 { receiver: 1 }, b"");
    assert_eq!(d.len(), OVERHEAD);
    for len in OVERHEAD_V2..OVERHEAD {
        let mut short = d[..len].to_vec();
        assert_eq!(
            ring.open_for(&mut short, 1, Versions::THIS_BUILD),
            Err(Error::Truncated),
            "length {len}"
        );
    }
    assert_eq!(KeyRing::peek_key_id(&d), Ok(KeyId::of(&K1)));
}

#[test]
fn version_sets() {
    assert_eq!(Versions::THIS_BUILD.iter().collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(Versions::THIS_BUILD.highest(), Some(VERSION));
    assert_eq!(Versions::PREVIOUS.highest(), Some(PREVIOUS_VERSION));
    assert_eq!(Versions::NONE.highest(), None);
    assert!(Versions::NONE.is_empty());
    let five: Versions = [2, 5, 200].into_iter().collect();
    assert_eq!(
        five.iter().collect::<Vec<_>>(),
        vec![2, 5],
        "200 is ignored"
    );
    assert!(!five.contains(200));
    assert_eq!(five.intersection(Versions::THIS_BUILD), Versions::PREVIOUS);
    assert_eq!(
        Addressing::V3 { receiver: 0 }.version(),
        VERSION,
        "version 3 is the bound one"
    );
}

#[test]
fn debug_output_has_no_key_material() {
    let ring = KeyRing::new("c", &[K1]).unwrap();
    let text = format!("{ring:?}");
    assert!(text.contains("KeyId"), "{text}");
    assert!(!text.contains("17, 17"), "{text}");
}
