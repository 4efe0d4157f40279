//! POSIX access control lists (Linux semantics): their extended-attribute encoding, the
//! access check, and how they meet mode bits (`chmod`, creates under a default ACL).
//! Pure functions, shared by the servers and by clients answering under a delegation, so
//! both decide alike (as `perm.rs` does for mode bits).
//!
//! An ACL travels as the value of [`ACCESS_XATTR`] or [`DEFAULT_XATTR`] in Linux's binary
//! form (`<linux/posix_acl_xattr.h>`): a little-endian `u32` version (2), then one 8-byte
//! entry per line (`u16` tag, `u16` permission bits, `u32` id). [`Acl`] keeps the entries
//! in the canonical order Linux requires: the owner, named users by id, the owning group,
//! named groups by id, the mask, others.

use crate::cred::Cred;
use crate::errno::Errno;

/// The extended attribute holding a file's access ACL.
pub const ACCESS_XATTR: &str = "system.posix_acl_access";
/// The extended attribute holding a directory's default ACL (inherited by what is
/// created in it).
pub const DEFAULT_XATTR: &str = "system.posix_acl_default";

/// `POSIX_ACL_XATTR_VERSION`.
const VERSION: u32 = 2;
/// Most entries an ACL may hold (ext4 allows about 500 in a 4 KiB block; this keeps an
/// inode record small).
pub const MAX_ENTRIES: usize = 256;

/// What an ACL entry is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    /// The file's owner (`ACL_USER_OBJ`).
    UserObj,
    /// A named user (`ACL_USER`).
    User(u32),
    /// The file's group (`ACL_GROUP_OBJ`).
    GroupObj,
    /// A named group (`ACL_GROUP`).
    Group(u32),
    /// The most any named user, the owning group or a named group may get (`ACL_MASK`).
    Mask,
    /// Everyone else (`ACL_OTHER`).
    Other,
}

/// One line of an ACL: whom it is about and its `rwx` bits (4, 2, 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    pub perm: u32,
}

impl Entry {
    /// One entry in text form, `TAG:ID:PERMS` (see [`Acl::from_text`]).
    pub fn from_text(raw: &str) -> Result<Entry, AclError> {
        let parts: Vec<&str> = raw.split(':').collect();
        let [tag, id, perm] = parts[..] else {
            return Err(bad(format!("'{raw}' is not TAG:ID:PERMS")));
        };
        let id = match id {
            "" => None,
            n => Some(n.parse::<u32>().map_err(|_| bad(format!("'{raw}': '{n}' is no numeric id")))?),
        };
        let tag = match (tag, id) {
            ("u" | "user", None) => Tag::UserObj,
            ("u" | "user", Some(n)) => Tag::User(n),
            ("g" | "group", None) => Tag::GroupObj,
            ("g" | "group", Some(n)) => Tag::Group(n),
            ("m" | "mask", None) => Tag::Mask,
            ("o" | "other", None) => Tag::Other,
            _ => return Err(bad(format!("'{raw}': no such entry"))),
        };
        let perm = perm_of_text(perm).ok_or_else(|| bad(format!("'{raw}': bad permissions")))?;
        Ok(Entry { tag, perm })
    }
}

/// A valid ACL, its entries in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

/// Why bytes are not an ACL (`EINVAL` to the caller, as Linux answers).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid ACL: {0}")]
pub struct AclError(pub String);

impl AclError {
    /// The errno a caller gets.
    pub fn errno(&self) -> Errno {
        Errno(libc::EINVAL)
    }
}

fn bad(why: impl Into<String>) -> AclError {
    AclError(why.into())
}

const TAG_USER_OBJ: u16 = 0x01;
const TAG_USER: u16 = 0x02;
const TAG_GROUP_OBJ: u16 = 0x04;
const TAG_GROUP: u16 = 0x08;
const TAG_MASK: u16 = 0x10;
const TAG_OTHER: u16 = 0x20;
/// The id of entries that name nobody (`ACL_UNDEFINED_ID`).
const UNDEFINED_ID: u32 = u32::MAX;

impl Acl {
    /// The ACL in an extended attribute's value. `Ok(None)` for a value with no entries
    /// (setting it removes the ACL, as `setfacl -b` does for a default ACL).
    pub fn from_xattr(value: &[u8]) -> Result<Option<Acl>, AclError> {
        if value.len() < 4 || !(value.len() - 4).is_multiple_of(8) {
            return Err(bad(format!("{} bytes is not a header and whole entries", value.len())));
        }
        let version = u32::from_le_bytes(value[..4].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(bad(format!("version {version}, not {VERSION}")));
        }
        let count = (value.len() - 4) / 8;
        if count == 0 {
            return Ok(None);
        }
        if count > MAX_ENTRIES {
            return Err(bad(format!("{count} entries, more than {MAX_ENTRIES}")));
        }
        let mut entries = Vec::with_capacity(count);
        for raw in value[4..].chunks_exact(8) {
            let tag = u16::from_le_bytes([raw[0], raw[1]]);
            let perm = u16::from_le_bytes([raw[2], raw[3]]) as u32;
            let id = u32::from_le_bytes(raw[4..8].try_into().expect("4 bytes"));
            if perm & !7 != 0 {
                return Err(bad(format!("permission bits {perm:#o}")));
            }
            let tag = match tag {
                TAG_USER_OBJ => Tag::UserObj,
                TAG_USER => Tag::User(id),
                TAG_GROUP_OBJ => Tag::GroupObj,
                TAG_GROUP => Tag::Group(id),
                TAG_MASK => Tag::Mask,
                TAG_OTHER => Tag::Other,
                other => return Err(bad(format!("unknown tag {other:#x}"))),
            };
            entries.push(Entry { tag, perm });
        }
        Acl::new(entries).map(Some)
    }

    /// An ACL of `entries`, which must be in canonical order with one owner, one owning
    /// group and one others entry, named ids once each, and a mask when any is named (what
    /// Linux's `posix_acl_valid` asks).
    pub fn new(entries: Vec<Entry>) -> Result<Acl, AclError> {
        for pair in entries.windows(2) {
            if pair[0].tag >= pair[1].tag {
                return Err(bad(format!("{:?} before {:?}: not in canonical order", pair[0].tag, pair[1].tag)));
            }
        }
        let has = |t: Tag| entries.iter().any(|e| e.tag == t);
        for base in [Tag::UserObj, Tag::GroupObj, Tag::Other] {
            if !has(base) {
                return Err(bad(format!("no {base:?} entry")));
            }
        }
        let named = entries.iter().any(|e| matches!(e.tag, Tag::User(_) | Tag::Group(_)));
        if named && !has(Tag::Mask) {
            return Err(bad("named entries without a mask"));
        }
        if entries.iter().any(|e| matches!(e.tag, Tag::User(UNDEFINED_ID) | Tag::Group(UNDEFINED_ID))) {
            return Err(bad("a named entry without an id"));
        }
        if entries.iter().any(|e| e.perm & !7 != 0) {
            return Err(bad("permission bits beyond rwx"));
        }
        Ok(Acl { entries })
    }

    /// The ACL that says what `mode`'s permission bits say (owner, group, others).
    pub fn from_mode(mode: u32) -> Acl {
        Acl {
            entries: vec![
                Entry { tag: Tag::UserObj, perm: (mode >> 6) & 7 },
                Entry { tag: Tag::GroupObj, perm: (mode >> 3) & 7 },
                Entry { tag: Tag::Other, perm: mode & 7 },
            ],
        }
    }

    /// The ACL stored as extended attribute `name` in `xattrs`, if any (a stored value
    /// that does not parse counts as none: values are validated when set).
    pub fn in_xattrs(xattrs: &[(String, Vec<u8>)], name: &str) -> Option<Acl> {
        let (_, v) = xattrs.iter().find(|(n, _)| n == name)?;
        Acl::from_xattr(v).ok().flatten()
    }

    /// The same ACL with only its search (`x`) bits: all a directory's ancestries need.
    pub fn search_part(&self) -> Acl {
        let entries = self.entries.iter().map(|e| Entry { tag: e.tag, perm: e.perm & 1 }).collect();
        Acl { entries }
    }

    /// The ACL in the short text form of `setfacl`/`getfacl` with numeric ids: entries
    /// `user::rwx`, `user:1001:r-x`, `group::r--`, `group:2000:rw-`, `mask::r-x`,
    /// `other::---` (or `u`, `g`, `m`, `o`; bits as `rwx`/`-` or one octal digit),
    /// separated by commas or newlines, in any order.
    pub fn from_text(text: &str) -> Result<Acl, AclError> {
        let mut entries = Vec::new();
        for raw in text.split([',', '\n']).map(str::trim).filter(|e| !e.is_empty()) {
            entries.push(Entry::from_text(raw)?);
        }
        entries.sort_by_key(|e| e.tag);
        Acl::new(entries)
    }

    /// The short text form (`user::rw-,user:1001:r-x,group::r--,mask::r-x,other::---`).
    pub fn to_text(&self) -> String {
        let bits = |p: u32| {
            let f = |b: u32, c: char| if p & b != 0 { c } else { '-' };
            format!("{}{}{}", f(4, 'r'), f(2, 'w'), f(1, 'x'))
        };
        let line = |e: &Entry| match e.tag {
            Tag::UserObj => format!("user::{}", bits(e.perm)),
            Tag::User(n) => format!("user:{n}:{}", bits(e.perm)),
            Tag::GroupObj => format!("group::{}", bits(e.perm)),
            Tag::Group(n) => format!("group:{n}:{}", bits(e.perm)),
            Tag::Mask => format!("mask::{}", bits(e.perm)),
            Tag::Other => format!("other::{}", bits(e.perm)),
        };
        self.entries.iter().map(line).collect::<Vec<_>>().join(",")
    }

    /// Its entries, in canonical order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Its extended attribute's value.
    pub fn to_xattr(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 8 * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            let (tag, id) = match e.tag {
                Tag::UserObj => (TAG_USER_OBJ, UNDEFINED_ID),
                Tag::User(id) => (TAG_USER, id),
                Tag::GroupObj => (TAG_GROUP_OBJ, UNDEFINED_ID),
                Tag::Group(id) => (TAG_GROUP, id),
                Tag::Mask => (TAG_MASK, UNDEFINED_ID),
                Tag::Other => (TAG_OTHER, UNDEFINED_ID),
            };
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&(e.perm as u16).to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    fn perm_of(&self, tag: Tag) -> Option<u32> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }

    fn set_perm(&mut self, tag: Tag, perm: u32) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.tag == tag) {
            e.perm = perm & 7;
        }
    }

    /// The permission bits of the mode that goes with this ACL: the owner's, the mask's
    /// (the owning group's without a mask) and the others' (`posix_acl_equiv_mode`).
    pub fn mode_bits(&self) -> u32 {
        let group = self.perm_of(Tag::Mask).or(self.perm_of(Tag::GroupObj)).unwrap_or(0);
        (self.perm_of(Tag::UserObj).unwrap_or(0) << 6) | (group << 3) | self.perm_of(Tag::Other).unwrap_or(0)
    }

    /// Whether mode bits say all this ACL says (only the three base entries): such an
    /// ACL is not kept, only the mode.
    pub fn is_mode(&self) -> bool {
        self.entries.len() == 3
    }

    /// Whether `cred` has every permission of `want` (`MAY_*` bits) on an object owned by
    /// `uid`:`gid` under this access ACL (`posix_acl_permission`; root is the caller's
    /// business, as in `perm.rs`).
    pub fn permits(&self, cred: &Cred, uid: u32, gid: u32, want: u32) -> bool {
        let want = want & 7;
        let mask = self.perm_of(Tag::Mask).unwrap_or(7);
        let grants = |perm: u32| perm & want == want;
        if cred.uid == uid {
            return grants(self.perm_of(Tag::UserObj).unwrap_or(0));
        }
        if let Some(p) = self.perm_of(Tag::User(cred.uid)) {
            return grants(p & mask);
        }
        // Every group entry the caller matches is tried; one granting is enough, and
        // matching any denies the others entry.
        let mut matched = false;
        for e in &self.entries {
            let member = match e.tag {
                Tag::GroupObj => cred.in_group(gid),
                Tag::Group(g) => cred.in_group(g),
                _ => false,
            };
            if member {
                if grants(e.perm & mask) {
                    return true;
                }
                matched = true;
            }
        }
        !matched && grants(self.perm_of(Tag::Other).unwrap_or(0))
    }

    /// `chmod` to `mode`: the owner and others entries take its bits, and the mask (the
    /// owning group without one) its group bits (`posix_acl_chmod`).
    pub fn chmod(&mut self, mode: u32) {
        self.set_perm(Tag::UserObj, mode >> 6);
        match self.perm_of(Tag::Mask) {
            Some(_) => self.set_perm(Tag::Mask, mode >> 3),
            None => self.set_perm(Tag::GroupObj, mode >> 3),
        }
        self.set_perm(Tag::Other, mode);
    }

    /// What something created with `mode` in a directory with default ACL `self` gets
    /// (`posix_acl_create`; no umask applies): its mode, and its access ACL when mode
    /// bits cannot say it. A new directory also takes `self` as its own default ACL.
    pub fn inherit(&self, mode: u32) -> (u32, Option<Acl>) {
        let mut acl = self.clone();
        let mut bits = mode & 0o777;
        for e in acl.entries.iter_mut() {
            match e.tag {
                Tag::UserObj => {
                    e.perm &= (bits >> 6) & 7;
                    bits = (bits & !0o700) | (e.perm << 6);
                }
                Tag::Other => {
                    e.perm &= bits & 7;
                    bits = (bits & !0o007) | e.perm;
                }
                _ => {}
            }
        }
        // The mask, or the owning group without one, meets the group bits.
        let group_tag = if acl.perm_of(Tag::Mask).is_some() { Tag::Mask } else { Tag::GroupObj };
        let group = acl.perm_of(group_tag).unwrap_or(0) & ((bits >> 3) & 7);
        acl.set_perm(group_tag, group);
        bits = (bits & !0o070) | (group << 3);
        let mode = (mode & !0o777) | bits;
        match acl.is_mode() {
            true => (mode, None),
            false => (mode, Some(acl)),
        }
    }
}

/// `rwx`-style (any order, `-` for none) or one octal digit.
fn perm_of_text(t: &str) -> Option<u32> {
    if let Ok(n) = t.parse::<u32>() {
        return (n <= 7 && t.len() == 1).then_some(n);
    }
    let mut p = 0;
    for c in t.chars() {
        p |= match c {
            'r' => 4,
            'w' => 2,
            'x' => 1,
            '-' => 0,
            _ => return None,
        };
    }
    (!t.is_empty()).then_some(p)
}

/// What is wrong with the ACL attributes among `xattrs` of an object of `mode` (a
/// directory when `dir`), as `fsck` reports it: a value that is no valid ACL, an access
/// ACL the mode says all of (never kept) or whose bits differ from the mode's, a default
/// ACL on something that is no directory.
pub fn problems(xattrs: &[(String, Vec<u8>)], mode: u32, dir: bool) -> Vec<String> {
    let mut out = Vec::new();
    for (name, v) in xattrs.iter().filter(|(n, _)| is_acl_name(n)) {
        match Acl::from_xattr(v) {
            Err(e) => out.push(format!("{name}: {e}")),
            Ok(None) => out.push(format!("{name}: an ACL without entries is kept")),
            Ok(Some(a)) if name == ACCESS_XATTR && a.is_mode() => {
                out.push(format!("{name}: kept although the mode says it all"))
            }
            Ok(Some(a)) if name == ACCESS_XATTR && a.mode_bits() != mode & 0o777 => {
                out.push(format!("{name}: its bits {:o} differ from the mode {:o}", a.mode_bits(), mode & 0o777))
            }
            Ok(Some(_)) if name == DEFAULT_XATTR && !dir => {
                out.push(format!("{name}: a default ACL on a non-directory"))
            }
            Ok(Some(_)) => {}
        }
    }
    out
}

/// Whether `name` is one of the two ACL attributes.
pub fn is_acl_name(name: &str) -> bool {
    name == ACCESS_XATTR || name == DEFAULT_XATTR
}

/// Sets (`Some`) or removes (`None`) ACL attribute `name` among the `xattrs` (sorted by
/// name) of an object of `mode`, as Linux's `set_posix_acl` does: the value must be a
/// valid ACL (an empty one removes); an access ACL sets the mode's permission bits and is
/// kept only when they cannot say it all. Removing an ACL that is not there is no error.
pub fn store(
    xattrs: &mut Vec<(String, Vec<u8>)>,
    mode: &mut u32,
    name: &str,
    value: Option<&[u8]>,
) -> Result<(), AclError> {
    let acl = match value {
        Some(v) => Acl::from_xattr(v)?,
        None => None,
    };
    let kept = match acl {
        Some(a) if name == ACCESS_XATTR => {
            *mode = (*mode & !0o777) | a.mode_bits();
            (!a.is_mode()).then(|| a.to_xattr())
        }
        Some(a) => Some(a.to_xattr()),
        None => None,
    };
    let at = xattrs.binary_search_by(|(n, _)| n.as_str().cmp(name));
    match (at, kept) {
        (Ok(i), Some(v)) => xattrs[i].1 = v,
        (Err(i), Some(v)) => xattrs.insert(i, (name.to_string(), v)),
        (Ok(i), None) => {
            xattrs.remove(i);
        }
        (Err(_), None) => {}
    }
    Ok(())
}

/// A `chmod` to `mode` of an object with these `xattrs`: its access ACL, if any, follows
/// (the owner, mask and others entries take the mode's bits).
pub fn chmod_xattrs(xattrs: &mut [(String, Vec<u8>)], mode: u32) {
    if let Some((_, v)) = xattrs.iter_mut().find(|(n, _)| n == ACCESS_XATTR) {
        if let Ok(Some(mut a)) = Acl::from_xattr(v) {
            a.chmod(mode);
            *v = a.to_xattr();
        }
    }
}

/// The ACL attributes of an object, in name order.
pub fn acl_xattrs(xattrs: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    xattrs.iter().filter(|(n, _)| is_acl_name(n)).cloned().collect()
}

/// Replaces the ACL attributes among `xattrs` by `acls` (both sorted by name).
pub fn replace_acl_xattrs(xattrs: &mut Vec<(String, Vec<u8>)>, acls: &[(String, Vec<u8>)]) {
    xattrs.retain(|(n, _)| !is_acl_name(n));
    xattrs.extend(acls.iter().cloned());
    xattrs.sort_by(|a, b| a.0.cmp(&b.0));
}

/// What an object created with `mode` by a caller of umask `umask` gets in a directory
/// whose default ACL is `parent` (`posix_acl_create`): with one, the mode the ACL allows
/// (no umask applies) and the ACL attributes to store (its access ACL unless the mode
/// says it all; a directory also inherits the default ACL); without, `mode & !umask`.
pub fn on_create(parent: Option<&Acl>, mode: u32, umask: u32, dir: bool) -> (u32, Vec<(String, Vec<u8>)>) {
    let Some(d) = parent else { return (mode & !(umask & 0o777), Vec::new()) };
    let (mode, access) = d.inherit(mode);
    let mut out = Vec::new();
    if let Some(a) = access {
        out.push((ACCESS_XATTR.to_string(), a.to_xattr()));
    }
    if dir {
        out.push((DEFAULT_XATTR.to_string(), d.to_xattr()));
    }
    (mode, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cred::{MAY_EXEC, MAY_READ, MAY_WRITE};

    fn acl(entries: &[(Tag, u32)]) -> Acl {
        Acl::new(entries.iter().map(|&(tag, perm)| Entry { tag, perm }).collect()).expect("valid")
    }

    fn cred(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred::new(uid, gid, groups.to_vec())
    }

    /// `user::rw-, user:1001:rwx, group::r--, group:2002:rw-, mask::r-x, other::---`.
    fn sample() -> Acl {
        acl(&[
            (Tag::UserObj, 6),
            (Tag::User(1001), 7),
            (Tag::GroupObj, 4),
            (Tag::Group(2002), 6),
            (Tag::Mask, 5),
            (Tag::Other, 0),
        ])
    }

    #[test]
    fn the_xattr_form_round_trips_and_matches_linux_bytes() {
        let a = sample();
        let bytes = a.to_xattr();
        assert_eq!(&bytes[..4], &[2, 0, 0, 0]);
        // The named user: tag 2, perm 7, id 1001.
        assert_eq!(&bytes[12..20], &[2, 0, 7, 0, 0xe9, 0x03, 0, 0]);
        // The owner: tag 1, perm 6, undefined id.
        assert_eq!(&bytes[4..12], &[1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(Acl::from_xattr(&bytes).unwrap(), Some(a));
        assert_eq!(Acl::from_xattr(&VERSION.to_le_bytes()).unwrap(), None, "no entries: remove");
    }

    #[test]
    fn the_text_form_round_trips() {
        let a = Acl::from_text("o::---, u::rw-,u:1001:rwx ,g::r--,group:2002:6,m::r-x").unwrap();
        assert_eq!(a, sample());
        assert_eq!(a.to_text(), "user::rw-,user:1001:rwx,group::r--,group:2002:rw-,mask::r-x,other::---");
        assert_eq!(Acl::from_text(&a.to_text()).unwrap(), a);
        assert!(Acl::from_text("u::rwx,g::r--").is_err(), "no others entry");
        assert!(Acl::from_text("u::rwx,u:bob:r--,g::r--,m::r--,o::---").is_err(), "names are not resolved");
        assert!(Acl::from_text("u::rwx,u:5:r--,g::r--,o::---").is_err(), "a named entry without mask");
        assert!(Acl::from_text("u::rwz,g::r--,o::---").is_err());
    }

    #[test]
    fn malformed_values_are_refused() {
        let good = sample().to_xattr();
        assert!(Acl::from_xattr(&good[..good.len() - 1]).is_err(), "a cut entry");
        let mut v = good.clone();
        v[0] = 1;
        assert!(Acl::from_xattr(&v).is_err(), "version 1");
        let mut v = good.clone();
        v[6] = 9;
        assert!(Acl::from_xattr(&v).is_err(), "permission bits beyond rwx");
        let mut v = good.clone();
        v[4] = 0x40;
        assert!(Acl::from_xattr(&v).is_err(), "unknown tag");
        // Named user without a mask.
        let no_mask = [
            (TAG_USER_OBJ, 6, UNDEFINED_ID),
            (TAG_USER, 6, 5),
            (TAG_GROUP_OBJ, 4, UNDEFINED_ID),
            (TAG_OTHER, 0, UNDEFINED_ID),
        ];
        let mut v = VERSION.to_le_bytes().to_vec();
        for (t, p, id) in no_mask {
            v.extend_from_slice(&t.to_le_bytes());
            v.extend_from_slice(&(p as u16).to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        assert!(Acl::from_xattr(&v).is_err());
        // Out of order, a duplicate id, a missing base entry.
        assert!(Acl::new(vec![Entry { tag: Tag::Other, perm: 0 }, Entry { tag: Tag::UserObj, perm: 6 }]).is_err());
        let dup = [
            (Tag::UserObj, 6),
            (Tag::User(5), 6),
            (Tag::User(5), 4),
            (Tag::GroupObj, 4),
            (Tag::Mask, 6),
            (Tag::Other, 0),
        ];
        assert!(Acl::new(dup.iter().map(|&(tag, perm)| Entry { tag, perm }).collect()).is_err());
        assert!(Acl::new(vec![Entry { tag: Tag::UserObj, perm: 6 }, Entry { tag: Tag::Other, perm: 0 }]).is_err());
    }

    #[test]
    fn the_check_follows_owner_named_user_groups_then_others() {
        let a = sample();
        let (uid, gid) = (1000, 1000);
        // The owner: its own entry, not masked.
        assert!(a.permits(&cred(1000, 50, &[]), uid, gid, MAY_READ | MAY_WRITE));
        assert!(!a.permits(&cred(1000, 50, &[]), uid, gid, MAY_EXEC));
        // A named user: rwx masked by r-x.
        assert!(a.permits(&cred(1001, 50, &[]), uid, gid, MAY_READ | MAY_EXEC));
        assert!(!a.permits(&cred(1001, 50, &[]), uid, gid, MAY_WRITE), "the mask takes w away");
        // The owning group: r--.
        assert!(a.permits(&cred(7, 1000, &[]), uid, gid, MAY_READ));
        assert!(!a.permits(&cred(7, 1000, &[]), uid, gid, MAY_WRITE));
        // A named group (supplementary): rw- masked to r--.
        assert!(a.permits(&cred(7, 9, &[2002]), uid, gid, MAY_READ));
        assert!(!a.permits(&cred(7, 9, &[2002]), uid, gid, MAY_WRITE));
        // A member of two matching groups: either entry may grant.
        let b = acl(&[(Tag::UserObj, 6), (Tag::GroupObj, 4), (Tag::Group(2002), 1), (Tag::Mask, 7), (Tag::Other, 7)]);
        assert!(b.permits(&cred(7, 1000, &[2002]), uid, gid, MAY_EXEC));
        assert!(b.permits(&cred(7, 1000, &[2002]), uid, gid, MAY_READ));
        // Matching a group entry that does not grant denies, whatever others get.
        assert!(!b.permits(&cred(7, 1000, &[]), uid, gid, MAY_WRITE), "others' w is not for group members");
        assert!(b.permits(&cred(7, 8, &[]), uid, gid, MAY_WRITE), "a stranger gets others' bits");
        // Nobody else: ---.
        assert!(!a.permits(&cred(7, 8, &[]), uid, gid, MAY_READ));
    }

    #[test]
    fn a_base_only_acl_is_its_mode() {
        let a = Acl::from_mode(0o750);
        assert!(a.is_mode());
        assert_eq!(a.mode_bits(), 0o750);
        assert!(a.permits(&cred(5, 1000, &[]), 1, 1000, MAY_READ | MAY_EXEC));
        assert!(!sample().is_mode());
        assert_eq!(sample().mode_bits(), 0o650, "the mask stands for the group bits");
    }

    #[test]
    fn chmod_sets_the_mask_not_the_owning_group() {
        let mut a = sample();
        a.chmod(0o701);
        assert_eq!(a.perm_of(Tag::UserObj), Some(7));
        assert_eq!(a.perm_of(Tag::Mask), Some(0));
        assert_eq!(a.perm_of(Tag::GroupObj), Some(4), "kept under the mask");
        assert_eq!(a.perm_of(Tag::User(1001)), Some(7), "named entries are kept");
        assert_eq!(a.perm_of(Tag::Other), Some(1));
        assert_eq!(a.mode_bits(), 0o701);
        let mut b = Acl::from_mode(0o644);
        b.chmod(0o640);
        assert_eq!(b, Acl::from_mode(0o640));
    }

    #[test]
    fn a_create_takes_the_default_acl_masked_by_its_mode() {
        let default =
            acl(&[(Tag::UserObj, 7), (Tag::User(1001), 7), (Tag::GroupObj, 5), (Tag::Mask, 7), (Tag::Other, 5)]);
        // A file created 0666: no x anywhere; the mask takes the group bits.
        let (mode, access) = default.inherit(0o100666);
        assert_eq!(mode, 0o100664);
        let access = access.expect("a named user is not a mode");
        assert_eq!(access.perm_of(Tag::UserObj), Some(6));
        assert_eq!(access.perm_of(Tag::User(1001)), Some(7), "named entries are copied as they are");
        assert_eq!(access.perm_of(Tag::Mask), Some(6));
        assert_eq!(access.perm_of(Tag::GroupObj), Some(5), "kept under the mask");
        assert_eq!(access.perm_of(Tag::Other), Some(4));
        // The effective rights of the named user are masked: rw-.
        assert!(!access.permits(&cred(1001, 1, &[]), 1000, 1000, MAY_EXEC));
        // A directory created 0777.
        let (mode, access) = default.inherit(0o040777);
        assert_eq!(mode, 0o040775);
        assert!(access.is_some());
        // A default ACL of base entries only gives a mode and no ACL.
        let plain = Acl::from_mode(0o750);
        assert_eq!(plain.inherit(0o100666), (0o100640, None));
        // Other mode bits (set-gid) are kept.
        assert_eq!(plain.inherit(0o042777).0, 0o042750);
    }
}
