//! Files only their owner reads: the embedded store's folder is created 0700 and its files
//! (the database, its WAL and shared memory) are 0600, whatever the umask. At start, what
//! is already there and readable by others is tightened; what cannot be (another user's
//! file, a read-only disk) is reported, in the log and at `/healthz`, and served anyway:
//! the proxy's checkpoints are sealed, and refusing to start would cost every request.

use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const FOLDER: u32 = 0o700;
const FILE: u32 = 0o600;
/// The bits that let anyone but the owner in.
const OTHERS: u32 = 0o077;

/// A folder or file others can read, and why it could not be made private.
#[derive(Debug, thiserror::Error)]
#[error("{} is readable by others (mode {mode:o}) and could not be made private", path.display())]
pub struct Exposure {
    pub path: PathBuf,
    pub mode: u32,
    #[source]
    pub source: io::Error,
}

/// Creates `dir` and the folders above it that are missing, each 0700. Returns whether
/// `dir` itself was created here.
pub fn create_folder(dir: &Path) -> io::Result<bool> {
    if dir.is_dir() {
        return Ok(false);
    }
    DirBuilder::new().recursive(true).mode(FOLDER).create(dir)?;
    // The umask may have taken bits the owner needs; it cannot have added any.
    fs::set_permissions(dir, Permissions::from_mode(FOLDER))?;
    Ok(true)
}

/// Creates the file at `path` 0600 unless it exists, so that SQLite, which gives its WAL
/// and shared-memory files the database's mode, creates them 0600 too.
pub fn create_file(path: &Path) -> io::Result<()> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Makes the folder or file at `path`, when it exists, its owner's alone.
pub fn tighten(path: &Path) -> Result<(), Exposure> {
    let Ok(meta) = fs::metadata(path) else {
        return Ok(());
    };
    let mode = meta.permissions().mode() & 0o7777;
    if mode & OTHERS == 0 {
        return Ok(());
    }
    // The owner's bits stay as they are: a file the operator made read-only stays so.
    fs::set_permissions(path, Permissions::from_mode(mode & 0o700)).map_err(|source| Exposure {
        path: path.to_owned(),
        mode,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn what_others_could_read_is_made_its_owner_s_alone() {
        let dir = std::env::temp_dir().join(format!("file-modes-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let folder = dir.join("a").join("state");
        assert!(create_folder(&folder).unwrap());
        assert!(!create_folder(&folder).unwrap());
        assert_eq!(mode(&folder), 0o700);
        let file = folder.join("cache.sqlite3");
        create_file(&file).unwrap();
        assert_eq!(mode(&file), 0o600);

        fs::set_permissions(&folder, Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&file, Permissions::from_mode(0o644)).unwrap();
        tighten(&folder).unwrap();
        tighten(&file).unwrap();
        assert_eq!((mode(&folder), mode(&file)), (0o700, 0o600));
        // A file that is not there is nothing to tighten.
        tighten(&folder.join("cache.sqlite3-wal")).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
