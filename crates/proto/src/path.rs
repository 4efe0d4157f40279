//! Validation and normalisation of plusfs paths and entry names.
//!
//! Paths are absolute, `/`-separated UTF-8 strings. Clients normalise them lexically (`.`
//! removed, `..` applied, repeated slashes collapsed) before sending; servers accept only
//! normalised paths, so a directory's path hash is the same for every client.
//!
//! Two limits apply, as on a local file system: the path a caller *gives* one call is at
//! most [`MAX_PATH_LEN`] (`PATH_MAX`), relative paths resolve against a working directory,
//! and the tree itself may be deeper: an absolute path inside the cluster may reach
//! [`MAX_TREE_PATH_LEN`].

/// Directory holding the files unlinked while open through a mount (sticky, writable
/// by everyone, as `/tmp`), made by `plusfs cluster up` or an admin's mount.
pub const ORPHANS: &str = "/.plusfs-orphans";

use crate::Errno;

/// Longest path a caller may give one call, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_LEN: usize = 4096;
/// Longest absolute path inside the cluster, in bytes: trees may be deeper than
/// `PATH_MAX` and are walked with relative paths, as on ext4.
pub const MAX_TREE_PATH_LEN: usize = 64 << 10;
/// Longest accepted entry name in bytes (Linux `NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;

/// Why a path or name was refused; carries the errno a POSIX caller expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathError {
    pub errno: Errno,
    pub reason: &'static str,
}

fn bad(errno: Errno, reason: &'static str) -> PathError {
    PathError { errno, reason }
}

/// Checks one entry name: non-empty, at most 255 bytes, no `/` or NUL, not `.` or `..`.
pub fn check_name(name: &str) -> Result<(), PathError> {
    if name.is_empty() {
        return Err(bad(Errno::EINVAL, "empty name"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(bad(Errno::ENAMETOOLONG, "name longer than 255 bytes"));
    }
    if name.contains('/') {
        return Err(bad(Errno::EINVAL, "name contains '/'"));
    }
    if name.contains('\0') {
        return Err(bad(Errno::EINVAL, "name contains NUL"));
    }
    if name == "." || name == ".." {
        return Err(bad(Errno::EINVAL, "'.' and '..' cannot be used as names"));
    }
    Ok(())
}

/// Normalises a user-supplied absolute path: collapses `//`, drops `.`, applies `..`
/// lexically (`..` of `/` is `/`). Refuses relative and empty paths, NUL bytes, components
/// over 255 bytes and paths over [`MAX_PATH_LEN`] bytes.
pub fn normalize(path: &str) -> Result<String, PathError> {
    if !path.is_empty() && !path.starts_with('/') {
        return Err(bad(Errno::EINVAL, "path is not absolute"));
    }
    resolve("/", path, MAX_PATH_LEN)
}

/// Resolves the path a caller gave (`path`, at most `given_limit` bytes) against the
/// normalised working directory `cwd` when it is relative, and normalises the result as
/// [`normalize`] does; the result may be up to [`MAX_TREE_PATH_LEN`] bytes.
pub fn resolve(cwd: &str, path: &str, given_limit: usize) -> Result<String, PathError> {
    if path.is_empty() {
        return Err(bad(Errno::ENOENT, "empty path"));
    }
    if path.len() > given_limit {
        return Err(bad(Errno::ENAMETOOLONG, "path longer than PATH_MAX (4096 bytes)"));
    }
    if path.contains('\0') {
        return Err(bad(Errno::EINVAL, "path contains NUL"));
    }
    let mut parts: Vec<&str> = Vec::new();
    let base = if path.starts_with('/') { "" } else { cwd };
    for comp in base.split('/').chain(path.split('/')) {
        match comp {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c if c.len() > MAX_NAME_LEN => {
                return Err(bad(Errno::ENAMETOOLONG, "path component longer than 255 bytes"))
            }
            c => parts.push(c),
        }
    }
    let len = parts.iter().map(|p| p.len() + 1).sum::<usize>();
    if len > MAX_TREE_PATH_LEN {
        return Err(bad(Errno::ENAMETOOLONG, "path deeper than the cluster's limit (64 KiB)"));
    }
    Ok(if parts.is_empty() { "/".to_string() } else { format!("/{}", parts.join("/")) })
}

/// True when `path` is already in the normal form servers accept.
pub fn is_normalized(path: &str) -> bool {
    if path == "/" {
        return true;
    }
    path.len() <= MAX_TREE_PATH_LEN
        && path.starts_with('/')
        && !path.ends_with('/')
        && path[1..].split('/').all(|c| check_name(c).is_ok())
}

/// Checks a path received from the network (servers never normalise on behalf of clients).
pub fn check_wire_path(path: &str) -> Result<(), PathError> {
    if is_normalized(path) {
        Ok(())
    } else if path.len() > MAX_TREE_PATH_LEN || path.split('/').any(|c| c.len() > MAX_NAME_LEN) {
        Err(bad(Errno::ENAMETOOLONG, "path or component too long"))
    } else {
        Err(bad(Errno::EINVAL, "path is not absolute and normalised"))
    }
}

/// The final component of the raw user path, before normalisation: `.`/`..` targets are
/// refused by mutating operations (`rmdir /a/.` is EINVAL, as on Linux).
pub fn raw_last_component(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

/// Splits a normalised path into (parent, name). `None` for `/`.
pub fn split(path: &str) -> Option<(&str, &str)> {
    if path == "/" {
        return None;
    }
    let i = path.rfind('/')?;
    let parent = if i == 0 { "/" } else { &path[..i] };
    Some((parent, &path[i + 1..]))
}

/// Joins a normalised directory path and a checked name.
pub fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// True when `path` is `ancestor` or lies below it.
pub fn is_within(path: &str, ancestor: &str) -> bool {
    ancestor == "/"
        || path == ancestor
        || (path.starts_with(ancestor) && path.as_bytes().get(ancestor.len()) == Some(&b'/'))
}

/// Rewrites `path` (which lies within `from`) to lie within `to` instead.
pub fn rebase(path: &str, from: &str, to: &str) -> String {
    debug_assert!(is_within(path, from));
    let rest = if from == "/" { &path[0..] } else { &path[from.len()..] };
    if rest.is_empty() {
        to.to_string()
    } else if to == "/" {
        rest.to_string()
    } else {
        format!("{to}{rest}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes() {
        assert_eq!(normalize("/").unwrap(), "/");
        assert_eq!(normalize("//a//b/./c/").unwrap(), "/a/b/c");
        assert_eq!(normalize("/a/../../b").unwrap(), "/b");
        assert_eq!(normalize("a").unwrap_err().errno, Errno::EINVAL);
        assert_eq!(normalize("").unwrap_err().errno, Errno::ENOENT);
        assert_eq!(normalize("/a\0b").unwrap_err().errno, Errno::EINVAL);
        let long = format!("/{}", "x".repeat(256));
        assert_eq!(normalize(&long).unwrap_err().errno, Errno::ENAMETOOLONG);
        let deep = "/aaaaaaa".repeat(600);
        assert_eq!(normalize(&deep).unwrap_err().errno, Errno::ENAMETOOLONG);
    }

    #[test]
    fn resolves_relative_paths_deeper_than_path_max() {
        let cwd = "/aaaaaaa".repeat(600);
        let p = resolve(&cwd, "b/../c", MAX_PATH_LEN).unwrap();
        assert_eq!(p, format!("{cwd}/c"));
        assert!(is_normalized(&p) && check_wire_path(&p).is_ok());
        assert_eq!(resolve(&cwd, "/x/./y", MAX_PATH_LEN).unwrap(), "/x/y");
        assert_eq!(resolve("/a", "..", MAX_PATH_LEN).unwrap(), "/");
        let given = "x/".repeat(2100);
        assert_eq!(resolve("/", &given, MAX_PATH_LEN).unwrap_err().errno, Errno::ENAMETOOLONG);
        assert!(resolve("/", &given, MAX_TREE_PATH_LEN).is_ok());
        let too_deep = "/abcdefg".repeat(8200);
        assert_eq!(resolve(&too_deep, "x", MAX_PATH_LEN).unwrap_err().errno, Errno::ENAMETOOLONG);
    }

    #[test]
    fn names() {
        assert!(check_name("ok").is_ok());
        assert_eq!(check_name("").unwrap_err().errno, Errno::EINVAL);
        assert_eq!(check_name("a/b").unwrap_err().errno, Errno::EINVAL);
        assert_eq!(check_name("..").unwrap_err().errno, Errno::EINVAL);
        assert_eq!(check_name(&"n".repeat(256)).unwrap_err().errno, Errno::ENAMETOOLONG);
    }

    #[test]
    fn wire_paths() {
        assert!(check_wire_path("/a/b").is_ok());
        assert!(check_wire_path("/").is_ok());
        assert!(check_wire_path("/a/").is_err());
        assert!(check_wire_path("/a/./b").is_err());
        assert!(check_wire_path("a").is_err());
    }

    #[test]
    fn split_join_rebase() {
        assert_eq!(split("/a"), Some(("/", "a")));
        assert_eq!(split("/a/b"), Some(("/a", "b")));
        assert_eq!(split("/"), None);
        assert_eq!(join("/", "a"), "/a");
        assert!(is_within("/a/b", "/a"));
        assert!(!is_within("/ab", "/a"));
        assert_eq!(rebase("/a/b/c", "/a/b", "/x"), "/x/c");
        assert_eq!(rebase("/a/b", "/a/b", "/x/y"), "/x/y");
        assert_eq!(raw_last_component("/a/.."), "..");
    }
}
