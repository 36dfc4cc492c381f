//! Shared test harness: the same store over io_uring, psync or the simulated disk. On the
//! simulated disk the store runs as a task (`Store::spawn_sim`): tests for it run on a
//! current-thread runtime with paused time, so they are deterministic. `UringTask` and
//! `PsyncTask` run the store's loop as a task on the test's runtime over a real file
//! (`Store::spawn`, as a node does) instead of on a thread of its own.
#![allow(dead_code)]

use basalt_engine::sim::SimDisk;
use basalt_engine::{
    DeviceId, FormatOptions, IoMode, ObjectId, OpenOptions, PoolId, Store, VolumeId, format,
    format_sim,
};
use bytes::Bytes;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Uring,
    Psync,
    Sim,
    UringTask,
    PsyncTask,
}

impl Backend {
    /// The backend's name in `StoreInfo::io_backend`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Uring | Backend::UringTask => "io_uring",
            Backend::Psync | Backend::PsyncTask => "psync",
            Backend::Sim => "sim",
        }
    }
}

/// A formatted device plus how to open it.
pub struct Dev {
    pub backend: Backend,
    pub dir: Option<tempfile::TempDir>,
    pub path: PathBuf,
    pub sim: Option<SimDisk>,
}

pub const OBJ: u32 = 128 * 1024;

pub fn oid(volume: u64, index: u64) -> ObjectId {
    ObjectId::new(PoolId(1), VolumeId(volume), index)
}

impl Dev {
    pub fn new(backend: Backend, size: u64, journal: u64) -> Dev {
        let opts = FormatOptions {
            device_id: DeviceId(7),
            object_size: OBJ,
            size: Some(size),
            journal_size: Some(journal),
            ..FormatOptions::default()
        };
        match backend {
            Backend::Sim => {
                let sim = SimDisk::new(size);
                format_sim(&sim, &opts).unwrap();
                Dev {
                    backend,
                    dir: None,
                    path: PathBuf::from("<sim>"),
                    sim: Some(sim),
                }
            }
            _ => {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("dev.img");
                format(&path, &opts).unwrap();
                Dev {
                    backend,
                    dir: Some(dir),
                    path,
                    sim: None,
                }
            }
        }
    }

    pub fn open_opts(&self) -> OpenOptions {
        OpenOptions {
            io: match self.backend {
                Backend::Psync | Backend::PsyncTask => IoMode::Psync,
                _ => IoMode::Uring,
            },
            writeback_idle: Duration::from_millis(1),
            ..OpenOptions::default()
        }
    }

    /// Opens the store. On the simulated disk it first waits until a store dropped before has
    /// finished its queued work and let go of the disk.
    pub async fn open(&self) -> Store {
        match &self.sim {
            Some(sim) => {
                sim.released().await;
                Store::spawn_sim(sim, &self.open_opts()).unwrap()
            }
            None if matches!(self.backend, Backend::UringTask | Backend::PsyncTask) => {
                Store::spawn(&self.path, &self.open_opts()).await.unwrap()
            }
            None => Store::open(&self.path, &self.open_opts()).unwrap(),
        }
    }

    /// The raw device bytes.
    pub fn raw(&self) -> Vec<u8> {
        match &self.sim {
            Some(sim) => sim.read(0, sim.size() as usize),
            None => std::fs::read(&self.path).unwrap(),
        }
    }

    /// Flips one byte of the device (media corruption).
    pub fn corrupt(&self, offset: u64) {
        match &self.sim {
            Some(sim) => sim.corrupt(offset),
            None => {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&self.path)
                    .unwrap();
                let mut b = [0u8; 1];
                f.read_exact_at(&mut b, offset).unwrap();
                b[0] ^= 0xff;
                f.write_all_at(&b, offset).unwrap();
                f.sync_all().unwrap();
            }
        }
    }
}

/// A deterministic pattern unique to (seed, length).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Finds every offset where `needle` occurs in `hay` (aligned to 4 KiB to keep it fast).
pub fn find_aligned(hay: &[u8], needle: &[u8]) -> Vec<u64> {
    (0..hay.len().saturating_sub(needle.len()) + 1)
        .step_by(4096)
        .filter(|&i| &hay[i..i + needle.len()] == needle)
        .map(|i| i as u64)
        .collect()
}

const BLK: usize = 4096;

/// One operation of the model.
#[derive(Clone, Debug)]
pub enum Op {
    Write { off: usize, data: Vec<u8> },
    Zero { off: usize, len: usize },
    Delete,
}

/// One object's model: bytes, allocated blocks, version (the sequence number of the store's
/// own versions: epoch 0, +1 per change), and whether it is a tombstone.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjState {
    pub data: Vec<u8>,
    pub alloc: Vec<bool>,
    pub version: u64,
    pub deleted: bool,
}

impl ObjState {
    pub fn empty(size: usize) -> Self {
        ObjState {
            data: vec![0; size],
            alloc: vec![false; size / BLK],
            version: 0,
            deleted: false,
        }
    }

    /// Live: written and not deleted.
    pub fn exists(&self) -> bool {
        self.version > 0 && !self.deleted
    }

    /// The store knows the object (live or a tombstone).
    pub fn known(&self) -> bool {
        self.version > 0
    }

    /// Deleted at the next version: no data, the version kept.
    fn tombstone(&self) -> ObjState {
        ObjState {
            version: self.version + 1,
            deleted: true,
            ..ObjState::empty(self.data.len())
        }
    }

    pub fn apply(&self, op: &Op) -> ObjState {
        let mut s = self.clone();
        match op {
            Op::Write { off, data } => {
                if s.deleted {
                    s = ObjState {
                        version: s.version,
                        ..ObjState::empty(s.data.len())
                    };
                }
                s.data[*off..off + data.len()].copy_from_slice(data);
                for b in off / BLK..=(off + data.len() - 1) / BLK {
                    s.alloc[b] = true;
                }
                s.version += 1;
            }
            Op::Zero { off, len } => {
                if !s.exists() {
                    return s;
                }
                s.data[*off..off + len].fill(0);
                for b in off / BLK..=(off + len - 1) / BLK {
                    let whole = b * BLK >= *off && (b + 1) * BLK <= off + len;
                    if whole {
                        s.alloc[b] = false;
                    }
                }
                if !s.alloc.iter().any(|a| *a) {
                    return self.tombstone();
                }
                s.version += 1;
            }
            Op::Delete if s.known() => return self.tombstone(),
            Op::Delete => {}
        }
        s
    }
}

/// `data` as write payload: in a 4 KiB-aligned buffer (as the NBD server receives whole-block
/// writes; the store then writes it without copying) or in an ordinary allocation.
pub fn payload(data: &[u8], aligned: bool) -> Bytes {
    if aligned {
        basalt_buf::AlignedBuf::copy_from(data)
            .into_bytes()
            .slice(..data.len())
    } else {
        Bytes::copy_from_slice(data)
    }
}
