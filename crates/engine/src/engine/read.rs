//! Reads: each 4 KiB block comes from the cache, from its slot on disk (CRC verified), or is
//! zero. A single cached block or a single contiguous disk run is returned without copying.
//!
//! A read returns the object's version as of the moment its blocks were resolved; a whole-object
//! read ([`crate::Store::read_object`]) also returns which blocks are allocated, so recovery can
//! copy an object and its version atomically. Reads of an object with held (uncommitted) writes
//! wait until they are committed: the primary of a replicated PG never serves data that a
//! replica might not have.
//!
//! A CRC mismatch is re-checked against the current index first: if the block moved meanwhile
//! (write-back or slot reuse raced with the read), the read is simply retried; otherwise it is
//! a real checksum error and no data is returned. A run the medium failed to read (`EIO`) is
//! read again block by block; a block that fails again is a bad copy too (`Unreadable`), and
//! any other I/O error fails the read as it is (`Io`).

use super::state::Src;
use super::{Engine, IoCtx, ReadReply};
use crate::buf::AlignedBuf;
use crate::crc::crc32c;
use crate::error::EngineError;
use crate::io::{IoDone, IoReq};
use crate::layout::BLOCK;
use crate::{ObjectContent, ObjectImage, Salvage, Version};
use basalt_types::ObjectId;
use bytes::Bytes;
use std::sync::atomic::Ordering;
use tokio::sync::oneshot;

const B: usize = BLOCK as usize;
const MAX_ATTEMPTS: u8 = 4;

/// What to read.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Want {
    Range { offset: u32, len: u32 },
}

/// Where the result goes.
pub(crate) enum Out {
    Range(ReadReply),
    Image(oneshot::Sender<Result<ObjectImage, EngineError>>),
    /// A whole-object image in which blocks failing their checksum (or that the device could
    /// not read) read as zeros and are listed instead of failing the read
    /// (`Store::read_object_salvage`).
    Salvage(oneshot::Sender<Result<Salvage, EngineError>>),
}

impl Out {
    fn fail(self, e: EngineError) {
        match self {
            Out::Range(tx) => tx.send(Err(e)),
            Out::Image(tx) => drop(tx.send(Err(e))),
            Out::Salvage(tx) => drop(tx.send(Err(e))),
        }
    }

    fn image(&self) -> bool {
        matches!(self, Out::Image(_) | Out::Salvage(_))
    }

    /// Answers an image read of an object that needs no device read.
    fn image_without_data(self, image: ObjectImage) {
        match self {
            Out::Range(_) => unreachable!("not an image read"),
            Out::Image(tx) => drop(tx.send(Ok(image))),
            Out::Salvage(tx) => drop(tx.send(Ok(Salvage {
                image,
                bad_blocks: Vec::new(),
            }))),
        }
    }
}

/// A read parked until its object's held writes are committed.
pub(crate) struct HeldRead {
    want: Want,
    out: Out,
}

pub(crate) struct ReadCtx {
    oid: ObjectId,
    offset: u32,
    len: u32,
    out: Option<Out>,
    /// The object's version and (for images) allocation when the blocks were resolved.
    version: Version,
    allocated: Vec<u64>,
    srcs: Vec<Src>,
    /// Assembled blocks (empty when a single disk run is adopted as the result).
    buf: Option<AlignedBuf>,
    adopted: Option<AlignedBuf>,
    pending: usize,
    retry: bool,
    failed: Option<EngineError>,
    attempt: u8,
    /// Salvage reads: blocks (of the object) that failed their checksum or could not be read.
    bad: Vec<u32>,
    /// Whether a block could not be read (counted as one read error).
    unreadable: bool,
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

    pub fn start_read(&mut self, oid: ObjectId, want: Want, out: Out) {
        if let Some(p) = &self.poisoned {
            out.fail(EngineError::Poisoned(p.clone()));
            return;
        }
        if self.closing {
            out.fail(EngineError::Closed);
            return;
        }
        if self.st.objs.get(&oid).is_some_and(|o| o.pending > 0) {
            self.held_reads
                .entry(oid)
                .or_default()
                .push(HeldRead { want, out });
            return;
        }
        let Want::Range { offset, len } = want;
        self.shared.reads.fetch_add(1, Ordering::Relaxed);
        self.shared
            .bytes_read
            .fetch_add(u64::from(len), Ordering::Relaxed);
        if out.image() {
            // Tombstones and unknown objects need no device read.
            match self.st.objs.get(&oid) {
                None => {
                    return out.image_without_data(ObjectImage {
                        version: Version::NONE,
                        content: ObjectContent::Absent,
                    });
                }
                Some(o) if o.is_tombstone() => {
                    return out.image_without_data(ObjectImage {
                        version: o.version,
                        content: ObjectContent::Tombstone,
                    });
                }
                Some(_) => {}
            }
        }
        self.issue_read(ctx(oid, offset, len, out));
    }

    /// Starts the reads held for `oid` (its held writes are committed, or replaced).
    pub fn release_held_reads(&mut self, oid: ObjectId) {
        for r in self.held_reads.remove(&oid).unwrap_or_default() {
            self.start_read(oid, r.want, r.out);
        }
    }

    /// Fails every held read (poisoned or closing store).
    pub fn fail_held_reads(&mut self, e: &EngineError) {
        for (_, reads) in self.held_reads.drain() {
            for r in reads {
                r.out.fail(e.duplicate());
            }
        }
    }

    fn issue_read(&mut self, mut ctx: ReadCtx) {
        let (first, last) = (
            ctx.offset / BLOCK as u32,
            (ctx.offset + ctx.len - 1) / BLOCK as u32,
        );
        ctx.srcs = self.srcs(&ctx.oid, first, last);
        if let Some(obj) = self.st.objs.get(&ctx.oid) {
            ctx.version = obj.version;
            if ctx.out.as_ref().is_some_and(Out::image) {
                ctx.allocated = self.st.alloc_bitmap(&ctx.oid, obj);
            }
        }
        let in_off = ctx.offset as usize - first as usize * B;
        let range = in_off..in_off + ctx.len as usize;
        // Fast paths: one cached block, or nothing allocated.
        if let [Src::Mem(buf, off)] = ctx.srcs.as_slice() {
            let bytes = buf.slice_bytes(off + range.start..off + range.end);
            return finish(ctx, bytes);
        }
        if ctx.srcs.iter().all(|s| matches!(s, Src::Zero)) {
            let zeros = Bytes::from(vec![0u8; ctx.len as usize]);
            return finish(ctx, zeros);
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
            ctx.buf = Some(out);
        }
        if runs.is_empty() {
            let out = ctx.buf.take().expect("assembled");
            let bytes = out.into_bytes().slice(range);
            return finish(ctx, bytes);
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
                IoCtx::Read {
                    rid,
                    first: i,
                    n,
                    alone: false,
                },
                IoReq::Read {
                    off,
                    buf: AlignedBuf::for_read(n * B),
                },
            );
        }
    }

    pub fn read_done(&mut self, rid: usize, first: usize, n: usize, alone: bool, d: IoDone) {
        let Some(ctx) = self.reads.get_mut(rid) else {
            return;
        };
        ctx.pending = ctx
            .pending
            .checked_sub(1)
            .expect("more read completions than reads");
        let IoReq::Read { mut buf, .. } = d.req else {
            return;
        };
        match d.res {
            // The medium failed somewhere in the run: each block is read again by itself, so
            // that only those that fail again count (and a passing error does not).
            // Not when the read is retried anyway, or failed already and salvages nothing.
            Err(e) if super::media_error(&e) && !alone => {
                let salvage = matches!(ctx.out, Some(Out::Salvage(_)));
                if !ctx.retry && (ctx.failed.is_none() || salvage) {
                    self.read_again_alone(rid, first, n);
                    return;
                }
                buf.fill(0);
            }
            // One block the medium cannot deliver: a bad copy, as a block failing its
            // checksum is (zeros in a salvage read).
            Err(e) if super::media_error(&e) => {
                buf.fill(0);
                self.bad_blocks(rid, first, vec![0], Some(e));
            }
            // Any other failure fails the read (the first failure of a read is the one told).
            Err(e) => {
                buf.fill(0);
                ctx.failed.get_or_insert(EngineError::Io(e));
            }
            Ok(()) => self.check_blocks(rid, first, n, &buf),
        }
        let ctx = self.reads.get_mut(rid).expect("present");
        match &mut ctx.buf {
            Some(out) => out[first * B..(first + n) * B].copy_from_slice(&buf),
            None => ctx.adopted = Some(buf),
        }
        let ctx = self.reads.get_mut(rid).expect("present");
        if ctx.pending > 0 {
            return;
        }
        let mut ctx = self.reads.remove(rid).expect("present");
        if let Some(e) = ctx.failed.take() {
            ctx.out.take().expect("reply").fail(e);
        } else if self.poisoned.is_some() {
            let p = self.poisoned.clone().unwrap_or_default();
            ctx.out
                .take()
                .expect("reply")
                .fail(EngineError::Poisoned(p));
        } else if ctx.retry {
            ctx.retry = false;
            ctx.attempt += 1;
            ctx.buf = None;
            ctx.adopted = None;
            ctx.bad.clear();
            self.issue_read(ctx);
        } else {
            let in_off = ctx.offset as usize % B;
            let mut buf = ctx.buf.take().or(ctx.adopted.take()).expect("read result");
            // Salvage: what failed its checksum reads as zeros (whole-object reads start at
            // block 0, so the block numbers index the buffer).
            for &b in &ctx.bad {
                buf[b as usize * B..(b as usize + 1) * B].fill(0);
            }
            let bytes = buf.into_bytes().slice(in_off..in_off + ctx.len as usize);
            finish(ctx, bytes);
        }
    }

    /// Reads blocks `first..first + n` of read `rid` again, each by itself, into the read's
    /// assembled buffer (made now if the run was to be adopted whole).
    fn read_again_alone(&mut self, rid: usize, first: usize, n: usize) {
        let Some(ctx) = self.reads.get_mut(rid) else {
            return;
        };
        if ctx.buf.is_none() {
            assert!(
                ctx.adopted.is_none(),
                "a run adopted before another completed"
            );
            ctx.buf = Some(AlignedBuf::zeroed(ctx.srcs.len() * B));
        }
        ctx.pending += n;
        let plan: Vec<(usize, u64)> = (first..first + n)
            .map(|i| match ctx.srcs[i] {
                Src::Disk { slot, block, .. } => (i, self.sb.slot_offset(slot, block)),
                _ => unreachable!("runs contain disk blocks only"),
            })
            .collect();
        for (i, off) in plan {
            self.submit(
                IoCtx::Read {
                    rid,
                    first: i,
                    n: 1,
                    alone: true,
                },
                IoReq::Read {
                    off,
                    buf: AlignedBuf::for_read(B),
                },
            );
        }
    }

    /// Verifies the CRCs of `n` blocks read for request `rid` starting at its block `first`:
    /// a block that moved meanwhile makes the read retry, else a mismatch fails it.
    fn check_blocks(&mut self, rid: usize, first: usize, n: usize, buf: &[u8]) {
        let Some(ctx) = self.reads.get_mut(rid) else {
            return;
        };
        let bad: Vec<usize> = (0..n)
            .filter(|&k| match &ctx.srcs[first + k] {
                Src::Disk { crc, .. } => crc32c(&buf[k * B..(k + 1) * B]) != *crc,
                _ => false,
            })
            .collect();
        if !bad.is_empty() {
            self.bad_blocks(rid, first, bad, None);
        }
    }

    /// Blocks `bad` (indexes from `first` in the read's run) of read `rid` failed their
    /// checksums, or the device could not read them (`failed`): read again if they moved
    /// meanwhile; else listed (salvage reads) or the read fails, and counted.
    fn bad_blocks(
        &mut self,
        rid: usize,
        first: usize,
        bad: Vec<usize>,
        failed: Option<std::io::Error>,
    ) {
        let Some(ctx) = self.reads.get_mut(rid) else {
            return;
        };
        let oid = ctx.oid;
        let fb = ctx.offset as usize / B;
        let expected: Vec<Src> = bad.iter().map(|&k| ctx.srcs[first + k].clone()).collect();
        let now: Vec<Src> = bad
            .iter()
            .map(|&k| {
                let b = (fb + first + k) as u32;
                self.srcs(&oid, b, b).remove(0)
            })
            .collect();
        let ctx = self.reads.get_mut(rid).expect("present");
        if now != expected && ctx.attempt + 1 < MAX_ATTEMPTS {
            ctx.retry = true;
        } else {
            let salvage = matches!(ctx.out, Some(Out::Salvage(_)));
            // A read that meets unreadable blocks is one read error, however many blocks.
            let first_unreadable = failed.is_some() && !ctx.unreadable;
            ctx.unreadable |= failed.is_some();
            if salvage {
                ctx.bad.extend(bad.iter().map(|&k| (fb + first + k) as u32));
                ctx.bad.sort_unstable();
                ctx.bad.dedup();
            } else if ctx.failed.is_none() {
                let offset = ((fb + first + bad[0]) * B) as u64;
                ctx.failed = Some(match &failed {
                    None => EngineError::Checksum { oid, offset },
                    Some(e) => EngineError::Unreadable {
                        oid,
                        offset,
                        detail: e.to_string(),
                    },
                });
            }
            // One checksum error per device read, as other reads count; in a salvage read
            // every bad block among the distinct ones (else the first: the read fails, and a
            // later unreadable block of it is not counted).
            let count = match salvage {
                true => expected.len(),
                false if failed.is_some() && !first_unreadable => 0,
                false => 1,
            };
            for (n, src) in expected.into_iter().take(count).enumerate() {
                if let Src::Disk { slot, block, crc } = src {
                    let off = self.sb.slot_offset(slot, block);
                    match (n, &failed) {
                        (0, None) => self.checksum_error(off, crc),
                        (0, Some(_)) if first_unreadable => self.read_error(off, crc),
                        _ => self.note_bad_block(off, crc),
                    }
                }
            }
        }
    }
}

fn ctx(oid: ObjectId, offset: u32, len: u32, out: Out) -> ReadCtx {
    ReadCtx {
        oid,
        offset,
        len,
        out: Some(out),
        version: Version::NONE,
        allocated: Vec::new(),
        srcs: Vec::new(),
        buf: None,
        adopted: None,
        pending: 0,
        retry: false,
        failed: None,
        attempt: 0,
        bad: Vec::new(),
        unreadable: false,
    }
}

/// Answers a read with its bytes.
fn finish(mut ctx: ReadCtx, bytes: Bytes) {
    match ctx.out.take().expect("reply") {
        Out::Range(tx) => tx.send(Ok((bytes, ctx.version))),
        Out::Image(tx) => {
            let _ = tx.send(Ok(ObjectImage {
                version: ctx.version,
                content: ObjectContent::Data {
                    data: bytes,
                    allocated: ctx.allocated,
                },
            }));
        }
        Out::Salvage(tx) => {
            let image = ObjectImage {
                version: ctx.version,
                content: ObjectContent::Data {
                    data: bytes,
                    allocated: ctx.allocated,
                },
            };
            let _ = tx.send(Ok(Salvage {
                image,
                bad_blocks: ctx.bad,
            }));
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
