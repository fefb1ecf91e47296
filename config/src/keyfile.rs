//! The gossip key file: one base64-encoded 32-byte key per line, the first seals.
//!
//! Blank lines and lines starting with `#` are ignored. Every bad line is reported with its line
//! number; a key is never printed in an error.

use base64::Engine as _;

/// Length of a gossip key in bytes (AES-256).
pub const KEY_LEN: usize = 32;

/// A rejected line of a key file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyFileError {
    /// The line is not base64.
    #[error("line {line}: not base64")]
    NotBase64 {
        /// 1-based line number.
        line: usize,
    },
    /// The line decodes to the wrong number of bytes.
    #[error(
        "line {line}: key is {len} bytes, expected 32 (generate one with `swimlb-speaker keygen`)"
    )]
    WrongLength {
        /// 1-based line number.
        line: usize,
        /// Decoded length.
        len: usize,
    },
    /// The same key appears twice.
    #[error("line {line}: same key as line {first}")]
    Duplicate {
        /// 1-based line number of the repetition.
        line: usize,
        /// 1-based line number of the first occurrence.
        first: usize,
    },
    /// No key at all.
    #[error("no key in the file")]
    Empty,
}

/// Parses a key file, reporting every bad line.
pub fn parse_key_file(text: &str) -> Result<Vec<[u8; KEY_LEN]>, Vec<KeyFileError>> {
    let mut keys: Vec<([u8; KEY_LEN], usize)> = Vec::new();
    let mut errors = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(trimmed) else {
            errors.push(KeyFileError::NotBase64 { line });
            continue;
        };
        let Ok(key) = <[u8; KEY_LEN]>::try_from(bytes.as_slice()) else {
            errors.push(KeyFileError::WrongLength {
                line,
                len: bytes.len(),
            });
            continue;
        };
        if let Some((_, first)) = keys.iter().find(|(k, _)| *k == key) {
            errors.push(KeyFileError::Duplicate {
                line,
                first: *first,
            });
            continue;
        }
        keys.push((key, line));
    }
    if keys.is_empty() && errors.is_empty() {
        errors.push(KeyFileError::Empty);
    }
    if errors.is_empty() {
        Ok(keys.into_iter().map(|(k, _)| k).collect())
    } else {
        Err(errors)
    }
}

/// The most a key file may hold; ten thousand keys fit. A larger "file" (`/dev/zero`, a log
/// given by mistake) is refused instead of read into memory.
pub const MAX_KEY_FILE_LEN: u64 = 1 << 20;

/// Reads a key file of at most [`MAX_KEY_FILE_LEN`] bytes that only its owner may read (as ssh
/// refuses a private key readable by group or others): a mode such as `0644` is refused with the
/// mode in the error, before a byte is read. A symbolic link is followed (a Kubernetes Secret
/// volume's files are links); the mode checked is the file's it names.
pub fn read_key_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::PermissionsExt as _;
    let file = std::fs::File::open(path)?;
    let mode = file.metadata()?.permissions().mode() & 0o7777;
    if let Some(who) = readers_beside_owner(mode) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("mode {mode:04o} lets {who} read the gossip key; chmod 600 it"),
        ));
    }
    let mut text = String::new();
    file.take(MAX_KEY_FILE_LEN + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_KEY_FILE_LEN {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_KEY_FILE_LEN} bytes: not a key file"),
        ));
    }
    Ok(text)
}

/// Who besides the owner may read a file of `mode`: `None` when nobody may.
fn readers_beside_owner(mode: u32) -> Option<&'static str> {
    match (mode & 0o040 != 0, mode & 0o004 != 0) {
        (false, false) => None,
        (true, false) => Some("its group"),
        (false, true) => Some("others"),
        (true, true) => Some("its group and others"),
    }
}

/// Writes a key file readable by its owner only (mode `0600`, also when `path` exists with
/// another mode): what [`read_key_file`] accepts.
pub fn write_key_file(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(text.as_bytes())
}

/// A new random key from the system's randomness (`/dev/urandom`).
pub fn random_key() -> std::io::Result<[u8; KEY_LEN]> {
    use std::io::Read as _;
    let mut key = [0u8; KEY_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    Ok(key)
}

/// A new key file holding one random key (what `swimlb-speaker keygen` prints, and what the
/// controller puts into the gossip key Secret when there is none).
pub fn new_key_file() -> std::io::Result<String> {
    Ok(format!("{}\n", encode_key(&random_key()?)))
}

/// Encodes a key as one line of a key file.
pub fn encode_key(key: &[u8; KEY_LEN]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_file_parses_as_one_key_and_differs_each_time() {
        let a = new_key_file().unwrap();
        assert_eq!(parse_key_file(&a).unwrap().len(), 1);
        assert_ne!(a, new_key_file().unwrap());
    }

    #[test]
    fn keys_are_read_in_order_with_comments_skipped() {
        let a = encode_key(&[1; 32]);
        let b = encode_key(&[2; 32]);
        let text = format!("# rotation in progress\n{b}\n\n{a}\n");
        assert_eq!(parse_key_file(&text), Ok(vec![[2; 32], [1; 32]]));
    }

    #[test]
    fn every_bad_line_is_reported() {
        let a = encode_key(&[1; 32]);
        let short = base64::engine::general_purpose::STANDARD.encode([0u8; 16]);
        let text = format!("{a}\nnot*base64\n{short}\n{a}\n");
        assert_eq!(
            parse_key_file(&text),
            Err(vec![
                KeyFileError::NotBase64 { line: 2 },
                KeyFileError::WrongLength { line: 3, len: 16 },
                KeyFileError::Duplicate { line: 4, first: 1 },
            ])
        );
    }

    #[test]
    fn a_key_file_too_large_is_refused_after_its_first_mebibyte() {
        let path =
            std::env::temp_dir().join(format!("swimlb-keyfile-large-{}", std::process::id()));
        let line = format!("{}\n", encode_key(&[1; 32]));
        write_key_file(
            &path,
            &line.repeat(MAX_KEY_FILE_LEN as usize / line.len() + 1),
        )
        .unwrap();
        let error = read_key_file(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            error.to_string(),
            "larger than 1048576 bytes: not a key file"
        );
        // `/dev/zero` (mode 0666) is refused for its mode before a byte is read.
        let error = read_key_file(std::path::Path::new("/dev/zero")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "mode 0666 lets its group and others read the gossip key; chmod 600 it"
        );
    }

    #[test]
    fn a_key_file_readable_by_group_or_others_is_refused_with_its_mode() {
        use std::os::unix::fs::PermissionsExt as _;
        let path = std::env::temp_dir().join(format!("swimlb-keyfile-mode-{}", std::process::id()));
        write_key_file(&path, &new_key_file().unwrap()).unwrap();
        assert!(read_key_file(&path).is_ok(), "0600 is read");
        for (mode, who) in [
            (0o644, "its group and others"),
            (0o640, "its group"),
            (0o604, "others"),
        ] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let error = read_key_file(&path).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!("mode {mode:04o} lets {who} read the gossip key; chmod 600 it")
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(read_key_file(&path).is_ok(), "0400 is read");
        // Writing again over a file of another mode leaves it 0600.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_key_file(&path, &new_key_file().unwrap()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_file_without_keys_is_an_error() {
        assert_eq!(
            parse_key_file("# nothing\n\n"),
            Err(vec![KeyFileError::Empty])
        );
    }
}
