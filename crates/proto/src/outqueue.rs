//! [`OutQueue`]: encoded frames waiting to be written, as a list of buffers for vectored writes.
//!
//! Sans-io: the caller asks for [`OutQueue::slices`], writes them with `write_vectored`, and
//! reports how many bytes went out with [`OutQueue::advance`].

use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::IoSlice;

/// Buffers up to this size are copied into the current header buffer instead of taking their own
/// I/O vector slot.
const COPY_LIMIT: usize = 8192;
/// At most this many buffers are offered to one vectored write.
const MAX_SLICES: usize = 64;

#[derive(Debug, Default)]
pub struct OutQueue {
    ready: VecDeque<Bytes>,
    head: BytesMut,
    bytes: usize,
}

impl OutQueue {
    pub fn new() -> Self {
        OutQueue::default()
    }

    /// The buffer to encode the next header and body into (see `encode_request`/`encode_response`).
    pub fn head(&mut self) -> &mut BytesMut {
        &mut self.head
    }

    /// Queues a frame's data part, written after everything encoded into [`OutQueue::head`] so far.
    pub fn push_data(&mut self, data: Bytes) {
        if data.len() <= COPY_LIMIT {
            self.head.extend_from_slice(&data);
        } else {
            self.seal();
            self.bytes += data.len();
            self.ready.push_back(data);
        }
    }

    fn seal(&mut self) {
        if !self.head.is_empty() {
            let head = self.head.split().freeze();
            self.bytes += head.len();
            self.ready.push_back(head);
        }
    }

    /// Bytes queued (including the open head buffer).
    pub fn len(&self) -> usize {
        self.bytes + self.head.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next buffers to write, in order.
    pub fn slices(&mut self) -> Vec<IoSlice<'_>> {
        self.seal();
        self.ready
            .iter()
            .take(MAX_SLICES)
            .map(|b| IoSlice::new(b))
            .collect()
    }

    /// Drops `n` written bytes from the front.
    pub fn advance(&mut self, mut n: usize) {
        self.bytes -= n.min(self.bytes);
        while n > 0 {
            let Some(front) = self.ready.front_mut() else {
                return;
            };
            let take = n.min(front.len());
            front.advance(take);
            n -= take;
            if front.is_empty() {
                self.ready.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_come_out_in_order_across_partial_writes() {
        let mut q = OutQueue::new();
        q.head().extend_from_slice(b"h1");
        q.push_data(Bytes::from_static(b"small"));
        q.head().extend_from_slice(b"h2");
        let big = Bytes::from(vec![7u8; 10_000]);
        q.push_data(big.clone());
        q.head().extend_from_slice(b"h3");
        let mut expected = b"h1smallh2".to_vec();
        expected.extend_from_slice(&big);
        expected.extend_from_slice(b"h3");
        assert_eq!(q.len(), expected.len());
        let mut out = Vec::new();
        while !q.is_empty() {
            // Simulate a socket that accepts at most 3000 bytes per call.
            let mut budget = 3000;
            let mut wrote = 0;
            for s in q.slices() {
                let take = s.len().min(budget);
                out.extend_from_slice(&s[..take]);
                budget -= take;
                wrote += take;
                if budget == 0 {
                    break;
                }
            }
            q.advance(wrote);
        }
        assert_eq!(out, expected);
    }
}
