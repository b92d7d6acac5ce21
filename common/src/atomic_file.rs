//! The one way this crate replaces a file: write a temporary file beside it, sync it,
//! rename it over the target and sync the directory, so a crash leaves either the old file
//! or the new one, never a torn one (checkpoints, `.bin` token files).

use crate::error::{io_err, Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Large enough that big arrays go out in few system calls.
const IO_BUF: usize = 1 << 20;

/// Replaces `path` with what `fill` writes. On any error the temporary file is removed and
/// `path` is left as it was.
pub fn write(path: &Path, fill: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>) -> Result<()> {
    write_timed(path, fill).map(|_| ())
}

/// [`write()`], returning how long the syncs took (the file's, then the directory's after the
/// rename): what is left of the time once the bytes are in the OS's cache.
pub fn write_timed(path: &Path, fill: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>) -> Result<Duration> {
    let (path, tmp) = &replacing(path, false)?;
    let mut sync = Duration::ZERO;
    let written = write_synced(tmp, path, fill).map(|took| sync = took);
    let syncing = Instant::now();
    put_in_place(tmp, path, written)?;
    Ok(sync + syncing.elapsed())
}

/// Renames `tmp` over `path` where `written` (its writing and syncing) succeeded, then syncs
/// the directory (the rename is durable only once the entry is on disk). On any error `tmp` is
/// removed and `path` left as it was.
fn put_in_place(tmp: &Path, path: &Path, written: Result<()>) -> Result<()> {
    if let Err(e) = written.and_then(|()| std::fs::rename(tmp, path).map_err(io_err(path))) {
        let _ = std::fs::remove_file(tmp); // best effort: the error above is the one to report
        return Err(e);
    }
    sync_dir(dir_of(path))
}

/// Replaces `path` with the file `make` creates at the path it is given: for writers that take
/// a path rather than a stream (a PNG encoder). That temporary path ends in `path`'s own
/// extension, as such writers choose their format by it. On any error it is removed and `path`
/// is left as it was.
pub fn write_by_path(path: &Path, make: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let (path, tmp) = &replacing(path, true)?;
    let made = make(tmp).and_then(|()| File::open(tmp).and_then(|f| f.sync_all()).map_err(io_err(path)));
    put_in_place(tmp, path, made)
}

/// A file written over a long time (a stream), which replaces its target only when
/// [`Pending::commit`]ted: until then the target keeps its old content, and an interrupted
/// writer leaves a temporary file that the next write of the target sweeps.
pub struct Pending {
    tmp: PathBuf,
    path: PathBuf,
    file: BufWriter<File>,
}

impl Pending {
    /// Starts the replacement of `path` (refused, as by [`write()`], where it is no regular file).
    pub fn create(path: &Path) -> Result<Pending> {
        let (path, tmp) = replacing(path, false)?;
        let file = File::create(&tmp).map_err(io_err(&path))?;
        Ok(Pending {
            tmp,
            path,
            file: BufWriter::with_capacity(IO_BUF, file),
        })
    }

    /// Appends `bytes` (errors name the target).
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        self.file.write_all(bytes).map_err(io_err(&self.path))
    }

    /// Syncs what was written and renames it over the target.
    pub fn commit(self) -> Result<()> {
        let Pending { tmp, path, file } = self;
        let synced = file
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all())
            .map_err(io_err(&path));
        put_in_place(&tmp, &path, synced)
    }
}

/// Writes and syncs `tmp`, the temporary file of `path` (which errors name: the one the user
/// knows): how long the sync took.
fn write_synced(
    tmp: &Path,
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<Duration> {
    let mut out = BufWriter::with_capacity(IO_BUF, File::create(tmp).map_err(io_err(path))?);
    fill(&mut out).and_then(|()| out.flush()).map_err(io_err(path))?;
    let file = out.into_inner().map_err(|e| e.into_error()).map_err(io_err(path))?;
    let syncing = Instant::now();
    file.sync_all().map_err(io_err(path))?;
    Ok(syncing.elapsed())
}

/// Where a write of `path` lands: `path` itself where it is a regular file or nothing yet, the
/// file a symbolic link names (the link stays a link, as a shell's `>` leaves it). A
/// directory, a pipe or a device is refused: the rename would replace it, not write into it.
fn landing(path: &Path) -> Result<PathBuf> {
    let mut at = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&at).map_err(io_err(&at))?;
                at = dir_of(&at).join(to);
            }
            Ok(m) if !m.is_file() => {
                return Err(Error::Input(format!(
                    "{}: not a regular file (a directory, pipe or device): give a file's path",
                    path.display()
                )))
            }
            // A file, or nothing yet (an unreadable place: the write says why).
            _ => return Ok(at),
        }
    }
    Err(Error::Input(format!(
        "{}: too many levels of symbolic links",
        path.display()
    )))
}

/// Removes `path` where it is there (a file that must not outlive what replaces it).
pub fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(path)(e)),
        _ => Ok(()),
    }
}

/// Makes the directory an `--out` names (and its parents) where it is missing: one line where
/// `--out` names a file instead.
pub fn create_dir(dir: &Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(Error::Input(format!(
            "--out {} is a file: give a directory",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(io_err(dir))
}

/// Removes the temporary files that writes of `path` by processes no longer running left
/// beside it (a write cut short by a kill: up to the size of the file, 1.5 GB for a GPT-2 124M
/// checkpoint). Returns how many it removed. Where it cannot tell whether a process runs
/// (no `/proc`), it removes none.
pub fn remove_stale_temps(path: &Path) -> usize {
    let path = &landing(path).unwrap_or_else(|_| path.to_path_buf());
    let Some(name) = path.file_name() else {
        return 0;
    };
    let name = name.to_string_lossy();
    let (prefix, suffixes) = (
        tmp_name_around(&name, false).0,
        [false, true].map(|ext| tmp_name_around(&name, ext).1),
    );
    let (Ok(entries), true) = (std::fs::read_dir(dir_of(path)), Path::new("/proc/self").exists()) else {
        return 0;
    };
    let stale = |file: &str| -> bool {
        let rest = file.strip_prefix(&prefix);
        let Some(pid) = suffixes
            .iter()
            .find_map(|suffix| rest.and_then(|r| r.strip_suffix(suffix.as_str())))
        else {
            return false;
        };
        pid.parse::<u32>()
            .is_ok_and(|pid| !Path::new("/proc").join(pid.to_string()).exists())
    };
    entries
        .flatten()
        .filter(|e| stale(&e.file_name().to_string_lossy()))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Where a replacement of `path` lands ([`landing`]) and the temporary file it is written to
/// first ([`tmp_path`]), dead writers' temporary files of it swept beforehand.
fn replacing(path: &Path, keep_extension: bool) -> Result<(PathBuf, PathBuf)> {
    let path = landing(path)?;
    remove_stale_temps(&path);
    let tmp = tmp_path(&path, keep_extension)?;
    Ok((path, tmp))
}

/// `<dir>/.<name>.<pid>.tmp` (with `keep_extension`, `.tmp.<ext>` of `name`'s extension):
/// beside the target, so the rename never crosses file systems, and one per process, so two
/// writers never share it.
fn tmp_path(path: &Path, keep_extension: bool) -> Result<PathBuf> {
    let Some(name) = path.file_name() else {
        return Err(Error::Input(format!("{}: not a file path", path.display())));
    };
    let (prefix, suffix) = tmp_name_around(&name.to_string_lossy(), keep_extension);
    Ok(path.with_file_name(format!("{prefix}{}{suffix}", std::process::id())))
}

/// What stands before and after the process id in the temporary file of a file `name`.
fn tmp_name_around(name: &str, keep_extension: bool) -> (String, String) {
    let ext = Path::new(name).extension().filter(|_| keep_extension);
    let suffix = match ext {
        Some(ext) => format!(".tmp.{}", ext.to_string_lossy()),
        None => ".tmp".to_string(),
    };
    (format!(".{name}."), suffix)
}

/// The directory `path` lies in (`.` for a bare file name).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}

/// Directories cannot be opened for syncing here; the rename is as durable as the OS makes it.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<()> {
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("atomic-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_link_is_written_through_and_stays_a_link() {
        let dir = scratch("link");
        std::fs::write(dir.join("target.txt"), "old").unwrap();
        std::os::unix::fs::symlink("target.txt", dir.join("link.txt")).unwrap();
        // A link to a link, and one to a file not there yet.
        std::os::unix::fs::symlink("link.txt", dir.join("link2.txt")).unwrap();
        std::os::unix::fs::symlink("new.txt", dir.join("dangling.txt")).unwrap();
        for (link, target) in [
            ("link.txt", "target.txt"),
            ("link2.txt", "target.txt"),
            ("dangling.txt", "new.txt"),
        ] {
            write(&dir.join(link), |f| f.write_all(link.as_bytes())).unwrap();
            assert!(
                std::fs::symlink_metadata(dir.join(link))
                    .unwrap()
                    .file_type()
                    .is_symlink(),
                "{link}"
            );
            assert_eq!(std::fs::read_to_string(dir.join(target)).unwrap(), link);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_write_by_path_keeps_the_extension_replaces_whole_and_sweeps_dead_writers_temps() {
        let dir = scratch("by-path");
        let target = dir.join("loss.png");
        std::fs::write(&target, "old").unwrap();
        // A writer that fails halfway leaves the old file and no temporary one.
        let e = write_by_path(&target, |tmp| {
            assert_eq!(tmp.extension().unwrap(), "png", "{}", tmp.display());
            std::fs::write(tmp, "half").unwrap();
            Err(Error::Input("drawing failed".into()))
        });
        assert!(e.is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "old");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file left");
        // Temporary files of writers that died (no such process) go; a live one's stays.
        let dead = dir.join(".loss.png.999999999.tmp.png");
        let stream_dead = dir.join(".loss.png.999999998.tmp");
        let live = dir.join(format!(".loss.png.{}.tmp.png", std::process::id()));
        for f in [&dead, &stream_dead] {
            std::fs::write(f, "x").unwrap();
        }
        write_by_path(&target, |tmp| {
            assert_eq!(tmp, live.as_path());
            std::fs::write(tmp, "new").map_err(io_err(tmp))
        })
        .unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        assert!(!dead.exists() && !stream_dead.exists() && !live.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_pipe_or_a_directory_is_refused_and_left_alone() {
        let dir = scratch("special");
        let pipe = dir.join("pipe");
        assert!(std::process::Command::new("mkfifo")
            .arg(&pipe)
            .status()
            .unwrap()
            .success());
        std::fs::create_dir(dir.join("sub")).unwrap();
        for name in ["pipe", "sub"] {
            let e = write(&dir.join(name), |f| f.write_all(b"x")).unwrap_err().to_string();
            assert!(e.contains("not a regular file"), "{name}: {e}");
        }
        assert!(std::fs::symlink_metadata(&pipe).unwrap().file_type().is_fifo());
        assert!(dir.join("sub").is_dir());
        std::os::unix::fs::symlink("pipe", dir.join("to-pipe")).unwrap();
        let e = write(&dir.join("to-pipe"), |f| f.write_all(b"x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("to-pipe: not a regular file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
