//! Block-level repair: when no copy of an object at a version verifies as a whole, the copies
//! may still be bad in different blocks (a flipped bit in block 3 on one device, in block 9 on
//! another). Every block carries its own CRC-32C, so each block is taken from a copy on which
//! it verifies; when every block verifies somewhere, the merged image is a good copy of that
//! version (copies of one version hold the same data: every member applies the same writes in
//! the same order, and recovery installs whole images at their version).

use super::messages::{ImageKind, ImageMeta, PeerAnswer, PeerMsg};
use super::{Ctx, Pg};
use basalt_placement::ClusterMap;
use basalt_types::{DeviceId, ObjectId, Version};
use bytes::{Bytes, BytesMut};
use std::collections::BTreeSet;
use std::sync::Arc;

const B: usize = 4096;

/// Copies merged so far: the image, and the blocks that verified on none of them yet.
struct Merged {
    meta: ImageMeta,
    data: BytesMut,
    missing: BTreeSet<u32>,
}

impl Merged {
    /// Takes from `data` every missing block that verified there (`bad` lists those that did
    /// not). `false` when the copy does not match the others (size or allocation).
    fn add(&mut self, meta: &ImageMeta, data: &[u8], bad: &[u32]) -> bool {
        if meta.allocated != self.meta.allocated || data.len() != self.data.len() {
            return false;
        }
        let bad: BTreeSet<u32> = bad.iter().copied().collect();
        let out = &mut self.data;
        self.missing.retain(|&b| {
            if bad.contains(&b) {
                return true;
            }
            let range = b as usize * B..(b as usize + 1) * B;
            out[range.clone()].copy_from_slice(&data[range]);
            false
        });
        true
    }
}

impl Pg {
    /// Merges the copies of `oid` at `version` on `devs` block by block (each read with
    /// [`basalt_engine::Store::read_object_salvage`] or `PeerMsg::Salvage`): the merged image
    /// when every block verified on one of them, else why not.
    pub(super) async fn merge_copies(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        devs: &[DeviceId],
        oid: ObjectId,
        version: Version,
    ) -> Result<(ImageMeta, Bytes), String> {
        let mut merged: Option<Merged> = None;
        let mut why = Vec::new();
        for &dev in devs {
            let (meta, data, bad) = match self.salvage(ctx, map, dev, oid).await {
                Ok(copy) => copy,
                Err(e) => {
                    why.push(format!("{dev}: {e}"));
                    continue;
                }
            };
            if bad.iter().any(|&b| (b as usize + 1) * B > data.len()) {
                why.push(format!("{dev} named a bad block past its data"));
                continue;
            }
            if meta.version != version || meta.kind != ImageKind::Data {
                why.push(format!(
                    "{dev} holds {:?} at {} instead",
                    meta.kind, meta.version
                ));
                continue;
            }
            match &mut merged {
                None => {
                    merged = Some(Merged {
                        meta,
                        data: BytesMut::from(&data[..]),
                        missing: bad.into_iter().collect(),
                    })
                }
                Some(m) => {
                    if !m.add(&meta, &data, &bad) {
                        why.push(format!("{dev}'s copy differs in size or allocation"));
                    }
                }
            }
            if merged.as_ref().is_some_and(|m| m.missing.is_empty()) {
                break;
            }
        }
        match merged {
            Some(m) if m.missing.is_empty() => Ok((m.meta, m.data.freeze())),
            Some(m) => Err(format!(
                "blocks {:?} fail their checksum on every copy{}",
                m.missing,
                why.iter().map(|w| format!("; {w}")).collect::<String>()
            )),
            None => Err(why.join("; ")),
        }
    }

    /// One device's salvaged copy: metadata, data (bad blocks as zeros) and its bad blocks.
    async fn salvage(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        dev: DeviceId,
        oid: ObjectId,
    ) -> Result<(ImageMeta, Bytes, Vec<u32>), String> {
        if dev == self.dev {
            let s = self
                .store
                .read_object_salvage(oid)
                .await
                .map_err(|e| e.to_string())?;
            let (meta, data) = ImageMeta::of(s.image);
            return Ok((meta, data, s.bad_blocks));
        }
        let msg = PeerMsg::Salvage {
            device: dev,
            pg: self.id,
            oid,
        };
        match ctx.peers.ask(map, dev, &msg, Bytes::new()).await {
            Ok((PeerAnswer::Salvaged { image, bad_blocks }, data)) => Ok((image, data, bad_blocks)),
            Ok((other, _)) => Err(format!("answered {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(allocated: Vec<u64>) -> ImageMeta {
        ImageMeta {
            version: Version::new(3, 1),
            kind: ImageKind::Data,
            allocated,
        }
    }

    /// Four blocks; block b of copy c holds byte 10·b + c where it verified, zero where not.
    fn copy(c: u8, bad: &[u32]) -> Vec<u8> {
        (0..4u8)
            .flat_map(|b| {
                let v = if bad.contains(&u32::from(b)) {
                    0
                } else {
                    10 * b + c
                };
                vec![v; B]
            })
            .collect()
    }

    #[test]
    fn each_block_comes_from_a_copy_it_verified_on() {
        let mut m = Merged {
            meta: meta(vec![0b1111]),
            data: BytesMut::from(&copy(1, &[1, 3])[..]),
            missing: [1, 3].into(),
        };
        assert!(m.add(&meta(vec![0b1111]), &copy(2, &[0, 3]), &[0, 3]));
        assert_eq!(m.missing, [3].into(), "block 1 from copy 2; 3 bad on both");
        assert!(
            !m.add(&meta(vec![0b0111]), &copy(3, &[]), &[]),
            "another allocation is another object state: not merged"
        );
        assert_eq!(m.missing, [3].into());
        assert!(m.add(&meta(vec![0b1111]), &copy(4, &[1]), &[1]));
        assert!(m.missing.is_empty());
        let blocks: Vec<u8> = m.data.chunks(B).map(|b| b[0]).collect();
        assert_eq!(
            blocks,
            vec![1, 12, 21, 34],
            "block 0 and 2 stay from copy 1"
        );
        assert!(m.data.chunks(B).all(|b| b.iter().all(|x| *x == b[0])));
    }
}
