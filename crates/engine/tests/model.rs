//! Random operation sequences checked against an in-memory model after every operation and
//! across reopens (clean close, and drop without close).

mod common;

use basalt_engine::{Store, WriteOptions};
use common::{Backend, Dev, OBJ, ObjState, Op, oid, pattern, payload};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const OBJECTS: u64 = 6;

fn random_op(rng: &mut StdRng) -> Op {
    let obj = OBJ as usize;
    match rng.random_range(0..14) {
        12..=13 => {
            // Whole blocks at a block boundary.
            let blocks = obj / 4096;
            let first = rng.random_range(0..blocks);
            let n = rng.random_range(1..=(blocks - first).min(5));
            Op::Write {
                off: first * 4096,
                data: pattern(rng.random(), n * 4096),
            }
        }
        0..=5 => {
            let off = rng.random_range(0..obj);
            let len = rng.random_range(1..=(obj - off).min(20_000));
            Op::Write {
                off,
                data: pattern(rng.random(), len),
            }
        }
        6..=7 => Op::Write {
            off: 0,
            data: pattern(rng.random(), obj),
        },
        8..=10 => {
            let off = rng.random_range(0..obj);
            let len = rng.random_range(1..=(obj - off));
            Op::Zero { off, len }
        }
        _ => Op::Delete,
    }
}

async fn check_all(store: &Store, model: &[ObjState], ctx: &str) {
    for (i, m) in model.iter().enumerate() {
        let got = store.read(oid(1, i as u64), 0, OBJ).await.unwrap();
        assert!(got == m.data, "{ctx}: object {i} data differs");
        let info = store.object_info(oid(1, i as u64)).await.unwrap();
        let (v, deleted) = info.map_or((0, false), |x| (x.version.seq, x.deleted));
        assert_eq!(v, m.version, "{ctx}: object {i} version");
        assert_eq!(deleted, m.deleted, "{ctx}: object {i} tombstone");
    }
    let listed = store.list_objects().await.unwrap();
    assert_eq!(
        listed.iter().filter(|o| !o.deleted).count(),
        model.iter().filter(|m| m.exists()).count(),
        "{ctx}: listed objects"
    );
    assert_eq!(
        listed.len(),
        model.iter().filter(|m| m.known()).count(),
        "{ctx}: listed objects and tombstones"
    );
}

async fn run(backend: Backend, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dev = Dev::new(backend, 24 << 20, 2 << 20);
    let mut store = dev.open().await;
    let mut model = vec![ObjState::empty(OBJ as usize); OBJECTS as usize];
    for i in 0..300 {
        let idx = rng.random_range(0..OBJECTS);
        let op = random_op(&mut rng);
        let opts = WriteOptions {
            durable: rng.random_bool(0.3),
            ..WriteOptions::default()
        };
        let o = oid(1, idx);
        match &op {
            Op::Write { off, data } => {
                let data = payload(data, rng.random_bool(0.5));
                store.write(o, *off as u32, data, opts).await.unwrap();
            }
            Op::Zero { off, len } => {
                store.trim(o, *off as u32, *len as u32, opts).await.unwrap();
            }
            Op::Delete => {
                store.delete(o, opts).await.unwrap();
            }
        }
        model[idx as usize] = model[idx as usize].apply(&op);
        let roff = rng.random_range(0..OBJ as usize);
        let rlen = rng.random_range(1..=(OBJ as usize - roff).min(40_000));
        let got = store.read(o, roff as u32, rlen as u32).await.unwrap();
        assert!(
            got[..] == model[idx as usize].data[roff..roff + rlen],
            "seed {seed} op {i}: read after {op:?}"
        );
        match rng.random_range(0..40) {
            0 => {
                store.close().await.unwrap();
                store = dev.open().await;
                check_all(
                    &store,
                    &model,
                    &format!("seed {seed} op {i} after close+reopen"),
                )
                .await;
            }
            1 => {
                store.flush().await.unwrap();
                drop(store);
                store = dev.open().await;
                check_all(
                    &store,
                    &model,
                    &format!("seed {seed} op {i} after drop+reopen"),
                )
                .await;
            }
            _ => {}
        }
    }
    check_all(&store, &model, &format!("seed {seed} end")).await;
    let stats = store.stats();
    assert_eq!(
        stats.objects,
        model.iter().filter(|m| m.exists()).count() as u64
    );
}

/// On the simulated disk the store runs as a task in virtual time: deterministic.
#[tokio::test(start_paused = true)]
async fn model_sim() {
    for seed in 0..12 {
        run(Backend::Sim, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_uring() {
    for seed in 100..103 {
        run(Backend::Uring, seed).await;
    }
}
