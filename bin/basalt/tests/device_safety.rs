//! Devices are formatted only when they are blank: a device holding a file system, a swap area, a
//! damaged Basalt store or any other data is refused unless `--force-format` is given, and a
//! device file that its host file system cannot fully preallocate is refused (unless
//! `--allow-sparse-device`) and removed again, so a full host file system can never surface later
//! as a failed device. Needs root for the mounts (skips with a message where mounting is not
//! permitted) and e2fsprogs/util-linux (mkfs.ext4, mkfs.ext2, mkswap).

mod common;

use common::host::{Mount, must_fail, up_args};
use common::nbd::NbdClient;
use common::{Up, UpOptions, tool_ok};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn sparse_file(path: &Path, size: u64) {
    std::fs::File::create(path).unwrap().set_len(size).unwrap();
}

fn head_and_tail(path: &Path) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap();
    let size = f.metadata().unwrap().len();
    let mut out = vec![0u8; 2 << 20];
    f.read_exact(&mut out[..1 << 20]).unwrap();
    f.seek(SeekFrom::Start(size - (1 << 20))).unwrap();
    f.read_exact(&mut out[1 << 20..]).unwrap();
    out
}

/// `basalt up` on `device` must refuse; returns its stderr.
fn up_refuses(data: &Path, device: &Path, extra: &[&str]) -> String {
    let mut args = up_args(data);
    args.extend(["--device".into(), device.display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    String::from_utf8_lossy(&must_fail(&args, LIMIT).stderr).into_owned()
}

/// Starts `basalt up` on `device` (a file of `device_size` if it must be created).
fn up_on(dir: &Path, device: &Path, device_size: &'static str, extra: &[&str]) -> Up {
    let mut all = vec!["--device".to_string(), device.display().to_string()];
    all.extend(extra.iter().map(|s| s.to_string()));
    Up::start(
        dir,
        &UpOptions {
            device_size,
            volume_size: "16MiB",
            extra: all,
        },
    )
}

#[test]
fn a_file_system_is_refused_and_left_intact_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("ext4.img");
    sparse_file(&dev, 256 << 20);
    tool_ok("mkfs.ext4", &["-q", "-F", dev.to_str().unwrap()], LIMIT);
    let before = head_and_tail(&dev);
    let err = up_refuses(&dir.path().join("data"), &dev, &[]);
    assert!(err.contains("ext4 file system"), "{err}");
    assert!(err.contains("--force-format"), "{err}");
    assert!(
        head_and_tail(&dev) == before,
        "the refused device was changed"
    );
    // A swap area too.
    let swap = dir.path().join("swap.img");
    sparse_file(&swap, 64 << 20);
    tool_ok("mkswap", &[swap.to_str().unwrap()], LIMIT);
    let err = up_refuses(&dir.path().join("data2"), &swap, &[]);
    assert!(err.contains("swap area"), "{err}");
    // With --force-format the file system is overwritten and the store serves.
    let up = up_on(dir.path(), &dev, "256MiB", &["--force-format"]);
    let mut c = NbdClient::connect(&up.nbd, "vol0").unwrap();
    assert_eq!(c.read(0, 4096).unwrap().unwrap(), vec![0u8; 4096]);
    c.disconnect();
    up.stop();
    // Restarting opens the store it formatted: no flag needed, nothing reformatted.
    let up = up_on(dir.path(), &dev, "256MiB", &[]);
    up.stop();
}

#[test]
fn stray_data_and_damaged_stores_are_refused_but_a_zero_file_is_formatted() {
    let dir = tempfile::tempdir().unwrap();
    // Non-zero bytes in the last MiB of an otherwise empty file.
    let dev = dir.path().join("tail.img");
    sparse_file(&dev, 128 << 20);
    let mut f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
    f.seek(SeekFrom::Start((128 << 20) - 100_000)).unwrap();
    f.write_all(b"someone's data").unwrap();
    drop(f);
    let err = up_refuses(&dir.path().join("d1"), &dev, &[]);
    assert!(err.contains("non-zero data"), "{err}");
    // The Basalt magic in the last 4 KiB: a (maybe damaged) store's backup superblock.
    let dev = dir.path().join("backup.img");
    sparse_file(&dev, 128 << 20);
    let mut f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
    f.seek(SeekFrom::Start((128 << 20) - 4096)).unwrap();
    f.write_all(b"BASALTSB").unwrap();
    drop(f);
    let err = up_refuses(&dir.path().join("d2"), &dev, &[]);
    assert!(err.contains("Basalt store"), "{err}");
    // A pre-existing all-zero sparse file is blank: formatted without the flag.
    let dev = dir.path().join("zero.img");
    sparse_file(&dev, 128 << 20);
    let up = up_on(dir.path(), &dev, "128MiB", &[]);
    up.stop();
    // Damage the first superblock's magic: the store is found by its backup copy at the end
    // of the device, repaired, and opened (never taken for a blank device).
    let mut f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
    f.write_all(&[0u8; 8]).unwrap();
    drop(f);
    let up = up_on(dir.path(), &dev, "128MiB", &[]);
    up.stop();
    assert_eq!(&head_and_tail(&dev)[..8], b"BASALTSB", "repaired");
    // Both copies' magic damaged: no longer recognised as a store, and still not blank.
    let size = std::fs::metadata(&dev).unwrap().len();
    let mut f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
    f.write_all(&[0u8; 8]).unwrap();
    f.seek(SeekFrom::Start(size - 4096)).unwrap();
    f.write_all(&[0u8; 8]).unwrap();
    drop(f);
    let before = head_and_tail(&dev);
    let err = up_refuses(&dir.path().join("data"), &dev, &[]);
    assert!(err.contains("non-zero data"), "{err}");
    assert!(
        head_and_tail(&dev) == before,
        "the damaged store was changed"
    );
}

#[test]
fn a_device_file_larger_than_its_tmpfs_is_refused_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mnt) = Mount::new(
        "tmpfs",
        Path::new("tmpfs"),
        "size=64m",
        &dir.path().join("mnt"),
    ) else {
        eprintln!("SKIPPED: mounting a tmpfs is not permitted on this host");
        return;
    };
    let dev = mnt.0.join("dev.img");
    let mut args = up_args(&dir.path().join("data"));
    args.extend(["--device".into(), dev.display().to_string()]);
    args.extend(["--device-size".into(), "256MiB".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = String::from_utf8_lossy(&must_fail(&args, LIMIT).stderr).into_owned();
    assert!(err.contains("cannot preallocate"), "{err}");
    assert!(!dev.exists(), "the half-made device file was left behind");
    assert!(
        mnt.used() < 1 << 20,
        "{} bytes of the tmpfs are still in use",
        mnt.used()
    );
    // A device that fits is preallocated in full at format: the tmpfs is charged for all of it.
    let fits = dir.path().join("fits");
    std::fs::create_dir_all(&fits).unwrap();
    let up = up_on(&fits, &dev, "48MiB", &[]);
    assert!(
        mnt.used() >= 48 << 20,
        "only {} bytes allocated",
        mnt.used()
    );
    up.stop();
}

#[test]
fn a_file_system_that_cannot_preallocate_needs_an_explicit_flag() {
    let dir = tempfile::tempdir().unwrap();
    // ext2 has no extents, so the kernel refuses fallocate (EOPNOTSUPP) on its files.
    let image = dir.path().join("ext2.img");
    sparse_file(&image, 128 << 20);
    tool_ok("mkfs.ext2", &["-q", "-F", image.to_str().unwrap()], LIMIT);
    let Some(mnt) = Mount::new("ext2", &image, "loop", &dir.path().join("mnt")) else {
        eprintln!("SKIPPED: mounting an ext2 image is not permitted on this host");
        return;
    };
    let dev = mnt.0.join("dev.img");
    let mut args = up_args(&dir.path().join("data"));
    args.extend(["--device".into(), dev.display().to_string()]);
    args.extend(["--device-size".into(), "64MiB".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = String::from_utf8_lossy(&must_fail(&args, LIMIT).stderr).into_owned();
    assert!(err.contains("cannot preallocate"), "{err}");
    assert!(err.contains("--allow-sparse-device"), "{err}");
    assert!(!dev.exists(), "the refused device file was left behind");
    let up = up_on(dir.path(), &dev, "64MiB", &["--allow-sparse-device"]);
    up.stop();
    let _ = Command::new("sync").status();
}
