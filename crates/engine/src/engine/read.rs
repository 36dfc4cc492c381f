//! Reads: each 4 KiB block comes from the cache, from its slot on disk (CRC verified), or is
//! zero. A single cached block or a single contiguous disk run is returned without copying.
//!
//! A CRC mismatch is re-checked against the current index first: if the block moved meanwhile
//! (write-back or slot reuse raced with the read), the read is simply retried; otherwise it is
//! a real checksum error and no data is returned.

use super::state::Src;
use super::{Engine, IoCtx};
use crate::buf::AlignedBuf;
use crate::crc::crc32c;
use crate::error::EngineError;
use crate::io::{IoDone, IoReq};
use crate::layout::BLOCK;
use basalt_types::ObjectId;
use bytes::Bytes;
use std::sync::atomic::Ordering;
use tokio::sync::oneshot;

const B: usize = BLOCK as usize;
const MAX_ATTEMPTS: u8 = 4;

pub(crate) struct ReadCtx {
    oid: ObjectId,
    offset: u32,
    len: u32,
    reply: Option<oneshot::Sender<Result<Bytes, EngineError>>>,
    srcs: Vec<Src>,
    /// Assembled blocks (empty when a single disk run is adopted as the result).
    out: Option<AlignedBuf>,
    adopted: Option<AlignedBuf>,
    pending: usize,
    retry: bool,
    failed: Option<EngineError>,
    attempt: u8,
}

impl Engine {
    fn srcs(&self, oid: &ObjectId, first: u32, last: u32) -> Vec<Src> {
        match self.st.objs.get(oid) {
            Some(obj) => (first..=last)
                .map(|b| self.st.block_src(oid, obj, b))
                .collect(),
            None => vec![Src::Zero; (last - first + 1) as usize],
        }
    }

    pub fn start_read(
        &mut self,
        oid: ObjectId,
        offset: u32,
        len: u32,
        reply: oneshot::Sender<Result<Bytes, EngineError>>,
    ) {
        self.shared.reads.fetch_add(1, Ordering::Relaxed);
        self.shared
            .bytes_read
            .fetch_add(u64::from(len), Ordering::Relaxed);
        let ctx = ReadCtx {
            oid,
            offset,
            len,
            reply: Some(reply),
            srcs: Vec::new(),
            out: None,
            adopted: None,
            pending: 0,
            retry: false,
            failed: None,
            attempt: 0,
        };
        self.issue_read(ctx);
    }

    fn issue_read(&mut self, mut ctx: ReadCtx) {
        let (first, last) = (
            ctx.offset / BLOCK as u32,
            (ctx.offset + ctx.len - 1) / BLOCK as u32,
        );
        ctx.srcs = self.srcs(&ctx.oid, first, last);
        let in_off = ctx.offset as usize - first as usize * B;
        let range = in_off..in_off + ctx.len as usize;
        // Fast paths: one cached block, or nothing allocated.
        if let [Src::Mem(buf, off)] = ctx.srcs.as_slice() {
            let bytes = buf.slice_bytes(off + range.start..off + range.end);
            let _ = ctx.reply.take().expect("reply").send(Ok(bytes));
            return;
        }
        if ctx.srcs.iter().all(|s| matches!(s, Src::Zero)) {
            let _ = ctx
                .reply
                .take()
                .expect("reply")
                .send(Ok(Bytes::from(vec![0u8; ctx.len as usize])));
            return;
        }
        let runs = disk_runs(&ctx.srcs);
        let single_run = runs.len() == 1 && runs[0].1 == ctx.srcs.len();
        if !single_run {
            let mut out = AlignedBuf::zeroed(ctx.srcs.len() * B);
            for (i, s) in ctx.srcs.iter().enumerate() {
                if let Src::Mem(buf, off) = s {
                    out[i * B..(i + 1) * B].copy_from_slice(&buf[*off..off + B]);
                }
            }
            ctx.out = Some(out);
        }
        if runs.is_empty() {
            let out = ctx.out.take().expect("assembled");
            let _ = ctx
                .reply
                .take()
                .expect("reply")
                .send(Ok(out.into_bytes().slice(range)));
            return;
        }
        ctx.pending = runs.len();
        let plan: Vec<(usize, usize, u64)> = runs
            .iter()
            .map(|&(i, n)| match ctx.srcs[i] {
                Src::Disk { slot, block, .. } => (i, n, self.sb.slot_offset(slot, block)),
                _ => unreachable!("runs contain disk blocks only"),
            })
            .collect();
        let rid = self.reads.insert(ctx);
        for (i, n, off) in plan {
            self.submit(
                IoCtx::Read { rid, first: i, n },
                IoReq::Read {
                    off,
                    buf: AlignedBuf::for_read(n * B),
                },
            );
        }
    }

    pub fn read_done(&mut self, rid: usize, first: usize, n: usize, d: IoDone) {
        let Some(ctx) = self.reads.get_mut(rid) else {
            return;
        };
        ctx.pending -= 1;
        let IoReq::Read { buf, .. } = d.req else {
            return;
        };
        if let Err(e) = d.res {
            ctx.failed = Some(EngineError::Io(e));
        } else {
            let bad: Vec<usize> = (0..n)
                .filter(|&k| match &ctx.srcs[first + k] {
                    Src::Disk { crc, .. } => crc32c(&buf[k * B..(k + 1) * B]) != *crc,
                    _ => false,
                })
                .collect();
            if !bad.is_empty() {
                let oid = ctx.oid;
                let fb = ctx.offset as usize / B;
                let expected: Vec<Src> = bad.iter().map(|&k| ctx.srcs[first + k].clone()).collect();
                let now: Vec<Src> = bad
                    .iter()
                    .map(|&k| {
                        self.srcs(&oid, (fb + first + k) as u32, (fb + first + k) as u32)
                            .remove(0)
                    })
                    .collect();
                let ctx = self.reads.get_mut(rid).expect("present");
                if now != expected && ctx.attempt + 1 < MAX_ATTEMPTS {
                    ctx.retry = true;
                } else {
                    self.shared.checksum_errors.fetch_add(1, Ordering::Relaxed);
                    let offset = ((fb + first + bad[0]) * B) as u64;
                    ctx.failed = Some(EngineError::Checksum { oid, offset });
                }
            }
            let ctx = self.reads.get_mut(rid).expect("present");
            match &mut ctx.out {
                Some(out) => out[first * B..(first + n) * B].copy_from_slice(&buf),
                None => ctx.adopted = Some(buf),
            }
        }
        let ctx = self.reads.get_mut(rid).expect("present");
        if ctx.pending > 0 {
            return;
        }
        let mut ctx = self.reads.remove(rid).expect("present");
        let reply = ctx.reply.take().expect("reply");
        if let Some(e) = ctx.failed.take() {
            let _ = reply.send(Err(e));
        } else if ctx.retry {
            ctx.retry = false;
            ctx.attempt += 1;
            ctx.out = None;
            ctx.adopted = None;
            ctx.reply = Some(reply);
            self.issue_read(ctx);
        } else {
            let in_off = ctx.offset as usize % B;
            let buf = ctx.out.take().or(ctx.adopted.take()).expect("read result");
            let bytes = buf.into_bytes().slice(in_off..in_off + ctx.len as usize);
            let _ = reply.send(Ok(bytes));
        }
    }
}

/// Maximal runs of disk blocks that are contiguous on the device: (first index, count).
fn disk_runs(srcs: &[Src]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut prev: Option<(u32, u32)> = None;
    for (i, s) in srcs.iter().enumerate() {
        match s {
            Src::Disk { slot, block, .. } => {
                match (prev, runs.last_mut()) {
                    (Some((ps, pb)), Some(run))
                        if ps == *slot && pb + 1 == *block && run.0 + run.1 == i =>
                    {
                        run.1 += 1
                    }
                    _ => runs.push((i, 1)),
                }
                prev = Some((*slot, *block));
            }
            _ => prev = None,
        }
    }
    runs
}
