//! Reads fields off the front of a body, big-endian, every read checking the length first: the
//! cursor the gossip payloads ([`crate::gossip`]) and the owner watch's datagrams
//! ([`crate::heartbeat`]) are parsed with. Each format adds its own compound fields in its module.

use crate::{Error, Result};

/// A cursor over the unread rest of a body.
pub(crate) struct Reader<'a> {
    pub(crate) rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        let (head, rest) = self.rest.split_first_chunk::<N>().ok_or(Error::Truncated)?;
        self.rest = rest;
        Ok(*head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.take::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_be_bytes(self.take()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    /// Everything left, as it is (an opaque tail).
    pub(crate) fn rest_opaque(&mut self) -> &'a [u8] {
        core::mem::take(&mut self.rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_fields_and_refuses_a_short_body() {
        let body = [1, 0, 2, 0, 0, 0, 3, 9];
        let mut r = Reader { rest: &body };
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16(), Ok(2));
        assert_eq!(r.u32(), Ok(3));
        assert_eq!(r.u64(), Err(Error::Truncated));
        assert_eq!(r.rest_opaque(), &[9]);
        assert_eq!(r.u8(), Err(Error::Truncated));
    }
}
