//! Simple replies and the [`ReplyQueue`] they wait in until the socket takes them.
//!
//! ```text
//! simple reply: magic 0x67446698 u32 | error u32 | cookie u64 | (READ success: length bytes)
//! ```
//!
//! Headers and small payloads are appended to one buffer; large payloads join the queue as
//! their own `Bytes` without a copy. [`ReplyQueue::io_slices`] offers everything queued to one
//! vectored write, so replies that complete together leave in one system call.

use crate::wire::{REPLY_HEADER_LEN, SIMPLE_REPLY_MAGIC};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::IoSlice;

/// Payloads up to this size are copied next to their header instead of taking an I/O vector
/// slot of their own (copying 4 KiB costs less than an extra slot and allocation).
const COPY_LIMIT: usize = 4096;
/// At most this many buffers go to one vectored write.
pub const MAX_SLICES: usize = 64;

/// Encodes a simple reply header.
pub fn encode_header(error: u32, cookie: u64) -> [u8; REPLY_HEADER_LEN] {
    let mut b = [0u8; REPLY_HEADER_LEN];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// Replies waiting to be written, in order.
#[derive(Debug, Default)]
pub struct ReplyQueue {
    sealed: VecDeque<Bytes>,
    sealed_len: usize,
    open: BytesMut,
}

impl ReplyQueue {
    pub fn new() -> Self {
        ReplyQueue::default()
    }

    /// Queues a reply: `error` 0 with the READ data as `payload`, or an error with no payload.
    pub fn push(&mut self, error: u32, cookie: u64, payload: Bytes) {
        self.open.put_slice(&encode_header(error, cookie));
        if payload.len() <= COPY_LIMIT {
            self.open.put_slice(&payload);
        } else {
            self.seal();
            self.sealed_len += payload.len();
            self.sealed.push_back(payload);
        }
    }

    fn seal(&mut self) {
        if !self.open.is_empty() {
            let head = self.open.split().freeze();
            self.sealed_len += head.len();
            self.sealed.push_back(head);
        }
    }

    /// Bytes queued.
    pub fn len(&self) -> usize {
        self.sealed_len + self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `iov` with the next buffers to write, in order; returns how many.
    pub fn io_slices<'a>(&'a mut self, iov: &mut [IoSlice<'a>; MAX_SLICES]) -> usize {
        self.seal();
        let mut n = 0;
        for (slot, buf) in iov.iter_mut().zip(self.sealed.iter()) {
            *slot = IoSlice::new(buf);
            n += 1;
        }
        n
    }

    /// Drops `n` written bytes from the front.
    pub fn advance(&mut self, mut n: usize) {
        self.sealed_len -= n.min(self.sealed_len);
        while n > 0 {
            let Some(front) = self.sealed.front_mut() else {
                return;
            };
            let take = n.min(front.len());
            front.advance(take);
            n -= take;
            if front.is_empty() {
                self.sealed.pop_front();
            }
        }
    }

    /// Forgets everything queued (the peer is gone).
    pub fn clear(&mut self) {
        self.sealed.clear();
        self.sealed_len = 0;
        self.open.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout() {
        let h = encode_header(22, 0x0102_0304_0506_0708);
        assert_eq!(
            h,
            [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 22, 1, 2, 3, 4, 5, 6, 7, 8]
        );
    }

    #[test]
    fn replies_come_out_in_order_across_partial_writes() {
        let mut q = ReplyQueue::new();
        let small = Bytes::from_static(b"small");
        let big = Bytes::from(vec![7u8; 10_000]);
        q.push(0, 1, small.clone());
        q.push(5, 2, Bytes::new());
        q.push(0, 3, big.clone());
        q.push(0, 4, Bytes::new());
        let mut want = Vec::new();
        want.extend_from_slice(&encode_header(0, 1));
        want.extend_from_slice(&small);
        want.extend_from_slice(&encode_header(5, 2));
        want.extend_from_slice(&encode_header(0, 3));
        want.extend_from_slice(&big);
        want.extend_from_slice(&encode_header(0, 4));
        assert_eq!(q.len(), want.len());
        let mut out = Vec::new();
        while !q.is_empty() {
            // A socket that takes at most 3000 bytes per call.
            let mut iov = [IoSlice::new(&[]); MAX_SLICES];
            let n = q.io_slices(&mut iov);
            let mut budget = 3000;
            let mut wrote = 0;
            for s in &iov[..n] {
                let take = s.len().min(budget);
                out.extend_from_slice(&s[..take]);
                budget -= take;
                wrote += take;
            }
            q.advance(wrote);
        }
        assert_eq!(out, want);
    }
}
