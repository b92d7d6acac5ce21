//! Which corpus a run trained on, as its checkpoints record it.

use std::fs;
use std::path::Path;

use crate::error::{io_err, Result};

/// Which corpus a run trained on, as its checkpoints record it, so that a resumed run can refuse
/// another: the file's name, its size and the xxHash64 of its first and of its last MiB (of the
/// whole of a smaller file), which reads two MiB of a corpus of any size. For a set of shards:
/// the first and last shard's names, the total size, the first MiB of the first shard, the
/// last MiB of the last, and the number of shards.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataIdentity {
    /// The file's name, without its directory (shown in messages; not compared).
    pub name: String,
    pub bytes: u64,
    /// xxHash64 (seed 0) of the first MiB, as `0x` and 16 hex digits.
    pub head_xxh64: String,
    /// xxHash64 (seed 0) of the last MiB, as `0x` and 16 hex digits.
    pub tail_xxh64: String,
    /// The number of shards, for a set of more than one (absent for a single file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u64>,
}

/// The bytes hashed at each end: a MiB.
const PART: u64 = 1 << 20;

/// xxHash64 of at most a MiB of `path` from byte `at`, as `0x` and 16 hex digits.
fn hash_part(path: &Path, at: u64) -> Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = fs::File::open(path).map_err(io_err(path))?;
    let mut part = Vec::new();
    file.seek(SeekFrom::Start(at)).map_err(io_err(path))?;
    file.take(PART).read_to_end(&mut part).map_err(io_err(path))?;
    Ok(format!("{:#018x}", xxhash_rust::xxh64::xxh64(&part, 0)))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}

fn size_of(path: &Path) -> Result<u64> {
    Ok(fs::metadata(path).map_err(io_err(path))?.len())
}

impl DataIdentity {
    /// The identity of the corpus at `path` (a regular file, as [`super::load_tokens`] wants).
    pub fn of(path: &Path) -> Result<Self> {
        crate::input::refuse_special(path, "a corpus file")?;
        let bytes = size_of(path)?;
        Ok(DataIdentity {
            name: file_name(path),
            bytes,
            head_xxh64: hash_part(path, 0)?,
            tail_xxh64: hash_part(path, bytes.saturating_sub(PART))?,
            shards: None,
        })
    }

    /// The identity of a set of shards, `paths` in their order (at least one).
    pub fn of_shards(paths: &[&Path]) -> Result<Self> {
        let (Some(first), Some(last)) = (paths.first(), paths.last()) else {
            crate::bail_input!("no shards");
        };
        let mut bytes = 0;
        for p in paths {
            bytes += size_of(p)?;
        }
        let name = match paths.len() {
            1 => file_name(first),
            n => format!("{n} shards {} … {}", file_name(first), file_name(last)),
        };
        Ok(DataIdentity {
            name,
            bytes,
            head_xxh64: hash_part(first, 0)?,
            tail_xxh64: hash_part(last, size_of(last)?.saturating_sub(PART))?,
            // One shard is the same data as that file given alone.
            shards: (paths.len() > 1).then_some(paths.len() as u64),
        })
    }

    /// Whether `other` holds the same data: its size, both hashes and its number of shards (a
    /// corpus moved or renamed is the same corpus).
    pub fn same_data(&self, other: &DataIdentity) -> bool {
        let key = |d: &DataIdentity| (d.bytes, d.head_xxh64.clone(), d.tail_xxh64.clone(), d.shards);
        key(self) == key(other)
    }
}

impl std::fmt::Display for DataIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, bytes) = (&self.name, self.bytes);
        match (bytes <= PART, self.shards) {
            (true, None) => write!(f, "{name} ({bytes} bytes, xxh64 {})", self.head_xxh64),
            (false, None) => write!(
                f,
                "{name} ({bytes} bytes, xxh64 of its first and last MiB {} and {})",
                self.head_xxh64, self.tail_xxh64
            ),
            (_, Some(_)) => write!(
                f,
                "{name} ({bytes} bytes, xxh64 of the first shard's first MiB and the last shard's last MiB {} and {})",
                self.head_xxh64, self.tail_xxh64
            ),
        }
    }
}
