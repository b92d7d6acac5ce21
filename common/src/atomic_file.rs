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
    let tmp = tmp_path(path)?;
    let written = write_synced(&tmp, path, fill).and_then(|sync| {
        std::fs::rename(&tmp, path).map_err(io_err(path))?;
        Ok(sync)
    });
    let sync = match written {
        Ok(sync) => sync,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp); // best effort: the error above is the one to report
            return Err(e);
        }
    };
    // The rename is durable only once the directory entry is on disk.
    let syncing = Instant::now();
    sync_dir(dir_of(path))?;
    Ok(sync + syncing.elapsed())
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

/// Removes the temporary files that writes of `path` by processes no longer running left
/// beside it (a write cut short by a kill: up to the size of the file, 1.5 GB for a GPT-2 124M
/// checkpoint). Returns how many it removed. Where it cannot tell whether a process runs
/// (no `/proc`), it removes none.
pub fn remove_stale_temps(path: &Path) -> usize {
    let Some(name) = path.file_name() else {
        return 0;
    };
    let (prefix, suffix) = tmp_name_around(&name.to_string_lossy());
    let (Ok(entries), true) = (std::fs::read_dir(dir_of(path)), Path::new("/proc/self").exists()) else {
        return 0;
    };
    let stale = |file: &str| -> bool {
        let Some(pid) = file.strip_prefix(&prefix).and_then(|rest| rest.strip_suffix(suffix)) else {
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

/// `<dir>/.<name>.<pid>.tmp`: beside the target, so the rename never crosses file systems,
/// and one per process, so two writers never share it.
fn tmp_path(path: &Path) -> Result<PathBuf> {
    let Some(name) = path.file_name() else {
        return Err(Error::Input(format!("{}: not a file path", path.display())));
    };
    let (prefix, suffix) = tmp_name_around(&name.to_string_lossy());
    Ok(path.with_file_name(format!("{prefix}{}{suffix}", std::process::id())))
}

/// What stands before and after the process id in the temporary file of a file `name`.
fn tmp_name_around(name: &str) -> (String, &'static str) {
    (format!(".{name}."), ".tmp")
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
