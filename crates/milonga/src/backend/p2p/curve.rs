//! CURVE security (docs/security.md): identities (a CURVE key pair with a
//! name), a trust directory of authorized public keys, and the ZAP handler
//! that admits only those keys to a node's listening sockets.
//!
//! The files are ZPL certificates as CZMQ's `zcert` and pyzmq's `zmq.auth`
//! write them (`public-key = "…"`, `secret-key = "…"`, Z85), so keys made
//! by those tools load here and the reverse.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use crate::discovery::Announcement;
use crate::model::acl::{Acl, Asker};
use crate::model::error::SecurityError;
use crate::model::node::NodeCore;
use crate::util::lock;

/// Bytes of a CURVE key.
pub const KEY_BYTES: usize = 32;
/// Characters of a key in Z85.
pub const Z85_KEY_CHARS: usize = 40;
/// Largest key or certificate file read.
const MAX_FILE_BYTES: u64 = 64 << 10;
/// Most `.pub` files a trust directory may hold.
pub const MAX_TRUSTED: usize = 10_000;

/// A CURVE public key: who a node is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey([u8; KEY_BYTES]);

impl PublicKey {
    /// The key of 40 Z85 characters.
    pub fn from_z85(text: &str) -> Result<PublicKey, SecurityError> {
        decode_key(text).map(PublicKey)
    }

    /// The key of 32 bytes.
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> PublicKey {
        PublicKey(bytes)
    }

    /// The key in Z85 (40 characters), as in `.pub` files and announcements.
    pub fn to_z85(&self) -> String {
        encode_key(&self.0)
    }

    /// The first 8 characters of the Z85 form: what `milonga ls` shows.
    pub fn fingerprint(&self) -> String {
        let mut z = self.to_z85();
        z.truncate(8);
        z
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }
}

impl std::fmt::Display for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_z85())
    }
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PublicKey({})", self.to_z85())
    }
}

impl std::str::FromStr for PublicKey {
    type Err = SecurityError;
    fn from_str(s: &str) -> Result<Self, SecurityError> {
        PublicKey::from_z85(s)
    }
}

fn decode_key(text: &str) -> Result<[u8; KEY_BYTES], SecurityError> {
    let text = text.trim();
    if text.len() != Z85_KEY_CHARS {
        return Err(SecurityError::BadKey(format!(
            "{} characters, a Z85 key has {Z85_KEY_CHARS}",
            text.len()
        )));
    }
    let bytes = zmq::z85_decode(text).map_err(|e| SecurityError::BadKey(e.to_string()))?;
    bytes
        .try_into()
        .map_err(|_| SecurityError::BadKey("not 32 bytes".into()))
}

fn encode_key(bytes: &[u8; KEY_BYTES]) -> String {
    // 32 bytes are a multiple of 4: Z85 cannot refuse them.
    zmq::z85_encode(bytes).unwrap_or_default()
}

/// Whether `name` may name a key file (and an identity in ACL rules).
pub fn valid_name(name: &str) -> bool {
    crate::model::config::valid_key_name(name)
}

/// A node's identity: a name and a CURVE key pair. The secret never
/// appears in `Debug` output or logs.
#[derive(Clone)]
pub struct Identity {
    name: String,
    public: PublicKey,
    secret: [u8; KEY_BYTES],
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name)
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// A new random key pair named `name` (libsodium's generator).
    pub fn generate(name: &str) -> Result<Identity, SecurityError> {
        if !valid_name(name) {
            return Err(SecurityError::BadName(name.into()));
        }
        let pair = zmq::CurveKeyPair::new().map_err(|_| SecurityError::NoCurve)?;
        Ok(Identity {
            name: name.into(),
            public: PublicKey(pair.public_key),
            secret: pair.secret_key,
        })
    }

    /// The identity's name (the key file's name without `.key`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The public key.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    pub(crate) fn secret(&self) -> &[u8; KEY_BYTES] {
        &self.secret
    }

    /// Reads a secret key file (`NAME.key`). It must be a regular file of
    /// its owner only (mode 0600 or stricter), and its public key must be
    /// the one its secret key gives.
    pub fn load(path: &Path) -> Result<Identity, SecurityError> {
        let (text, meta) = read_small_with(path)?;
        let fields = parse_zpl(&text, path)?;
        let malformed = |why: &str| SecurityError::Malformed {
            path: path.into(),
            why: why.into(),
        };
        let secret = fields
            .get("secret-key")
            .ok_or_else(|| malformed("no secret-key (a .pub file is not an identity)"))?;
        // The file read, not a second look at the path.
        let mode = meta.permissions().mode();
        let owner = std::os::unix::fs::MetadataExt::uid(&meta);
        if owner != crate::util::sys::uid() && owner != 0 {
            return Err(SecurityError::Owner {
                path: path.into(),
                owner,
            });
        }
        if mode & 0o077 != 0 {
            return Err(SecurityError::Permissions {
                path: path.into(),
                mode: mode & 0o777,
            });
        }
        let secret = decode_key(secret).map_err(|e| malformed(&format!("secret-key: {e}")))?;
        let public = public_of(&secret)?;
        if let Some(p) = fields.get("public-key") {
            let p = decode_key(p).map_err(|e| malformed(&format!("public-key: {e}")))?;
            if p != public.0 {
                return Err(SecurityError::Mismatch { path: path.into() });
            }
        }
        let name = fields
            .get("name")
            .cloned()
            .or_else(|| stem(path, "key"))
            .filter(|n| valid_name(n))
            .unwrap_or_else(|| public.fingerprint());
        Ok(Identity {
            name,
            public,
            secret,
        })
    }

    /// Writes `DIR/NAME.key` (the secret, mode 0600) and `DIR/NAME.pub`
    /// (the public key, mode 0644), creating `DIR` (mode 0700) if needed.
    /// Never overwrites a file. Returns both paths.
    pub fn write(&self, dir: &Path) -> Result<(PathBuf, PathBuf), SecurityError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SecurityError::Io { path, source }
        };
        if !dir.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io(dir))?;
        }
        let key = dir.join(format!("{}.key", self.name));
        let public = dir.join(format!("{}.pub", self.name));
        for p in [&key, &public] {
            if p.exists() {
                return Err(SecurityError::Exists(p.clone()));
            }
        }
        write_new(&key, self.secret_text().as_bytes(), 0o600).map_err(io(&key))?;
        write_new(&public, self.public_text().as_bytes(), 0o644).map_err(io(&public))?;
        Ok((key, public))
    }

    /// The text of `NAME.key`.
    fn secret_text(&self) -> String {
        format!(
            "# Milonga CURVE identity {name}: the SECRET key (made {stamp} by milonga).\n\
             # Readable by its owner only; never copy it to another machine.\n\n\
             metadata\n    name = \"{name}\"\ncurve\n    public-key = \"{z}\"\n    secret-key = \"{s}\"\n",
            name = self.name,
            stamp = humantime_now(),
            z = self.public.to_z85(),
            s = encode_key(&self.secret),
        )
    }

    /// The text of `NAME.pub`.
    fn public_text(&self) -> String {
        format!(
            "# Milonga CURVE identity {name}: the public key (made {stamp} by milonga).\n\
             # Put it in the trust directory of every node that may talk to {name}.\n\n\
             metadata\n    name = \"{name}\"\ncurve\n    public-key = \"{z}\"\n",
            name = self.name,
            stamp = humantime_now(),
            z = self.public.to_z85(),
        )
    }
}

/// Writes `text` at `path` unless a file is there, atomically: written
/// under a temporary name, then linked into place, so that two nodes
/// opening at once never read a half-written file. Whether it wrote.
fn create_atomically(path: &Path, text: &str, mode: u32) -> Result<bool, SecurityError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SecurityError::Io { path, source }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    let _ = fs::remove_file(&tmp);
    write_new(&tmp, text.as_bytes(), mode).map_err(io(&tmp))?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io(path)(e)),
    }
}

/// The user's default trust directory, `dir/trust` (`dir` is
/// `$XDG_CONFIG_HOME/milonga`), made (mode 0700) if missing.
pub(crate) fn default_trust(dir: &Path) -> Result<PathBuf, SecurityError> {
    let trust = dir.join("trust");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&trust)
        .map_err(|source| SecurityError::Io {
            path: trust.clone(),
            source,
        })?;
    Ok(trust)
}

/// The user's default identity, `dir/identity.key`, made if missing
/// (named after this host), its public key put in the default trust
/// directory (made if missing). The key file.
pub(crate) fn default_identity(dir: &Path) -> Result<PathBuf, SecurityError> {
    let trust = default_trust(dir)?;
    let key = dir.join("identity.key");
    if !key.exists() {
        let id = Identity::generate(&default_name())?;
        if create_atomically(&key, &id.secret_text(), 0o600)? {
            tracing::info!(key = %key.display(), public = %id.public(), "made this user's default identity");
        }
    }
    // Whichever node made it, its public key is trusted here.
    let id = Identity::load(&key)?;
    let public = trust.join(format!("{}.pub", id.name()));
    if !public.exists() {
        create_atomically(&public, &id.public_text(), 0o644)?;
    }
    Ok(key)
}

/// This host's name as a key name ("node" if it has none that fits).
fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = host
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(64)
        .collect();
    if valid_name(&name) {
        name
    } else {
        "node".into()
    }
}

/// The public key a secret key gives.
fn public_of(secret: &[u8; KEY_BYTES]) -> Result<PublicKey, SecurityError> {
    let z = zmq::z85_encode(secret).map_err(|_| SecurityError::NoCurve)?;
    let mut secret_z = z.into_bytes();
    secret_z.push(0);
    let mut public_z = [0u8; Z85_KEY_CHARS + 1];
    let rc = super::zmq_io::curve_public(&mut public_z, &secret_z);
    if rc != 0 {
        return Err(SecurityError::NoCurve);
    }
    let text =
        std::str::from_utf8(&public_z[..Z85_KEY_CHARS]).map_err(|_| SecurityError::NoCurve)?;
    PublicKey::from_z85(text)
}

fn stem(path: &Path, ext: &str) -> Option<String> {
    (path.extension()? == ext).then(|| path.file_stem()?.to_str().map(str::to_owned))?
}

fn humantime_now() -> String {
    let s = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{s} (seconds since 1970, UTC)")
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Reads a regular file of at most [`MAX_FILE_BYTES`], not following a
/// link and not blocking on a FIFO.
fn read_small(path: &Path) -> Result<String, SecurityError> {
    read_small_with(path).map(|(text, _)| text)
}

/// [`read_small`], and the file's metadata (of the descriptor read).
fn read_small_with(path: &Path) -> Result<(String, fs::Metadata), SecurityError> {
    let io = |source: std::io::Error| {
        if source.raw_os_error() == Some(libc::ELOOP) {
            // O_NOFOLLOW's refusal: say what it means.
            return SecurityError::Malformed {
                path: path.into(),
                why: "a symbolic link, not followed: name the file it points to".into(),
            };
        }
        SecurityError::Io {
            path: path.into(),
            source,
        }
    };
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(SecurityError::Malformed {
            path: path.into(),
            why: "not a regular file".into(),
        });
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(SecurityError::Malformed {
            path: path.into(),
            why: format!("{} bytes, at most {MAX_FILE_BYTES}", meta.len()),
        });
    }
    let mut text = String::new();
    f.take(MAX_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| SecurityError::Malformed {
            path: path.into(),
            why: e.to_string(),
        })?;
    Ok((text, meta))
}

/// The `name = "value"` lines of a ZPL file (sections and comments aside):
/// what a key file needs.
fn parse_zpl(text: &str, path: &Path) -> Result<HashMap<String, String>, SecurityError> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            continue; // a section name
        };
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        out.insert(name.trim().to_owned(), value.to_owned());
    }
    if !out.contains_key("public-key") && !out.contains_key("secret-key") {
        return Err(SecurityError::Malformed {
            path: path.into(),
            why: "no public-key or secret-key line".into(),
        });
    }
    Ok(out)
}

/// Reads a public key file (`NAME.pub`, or a `.key` file's public part).
pub fn load_public(path: &Path) -> Result<(String, PublicKey), SecurityError> {
    public_of_text(&read_small(path)?, path)
}

/// The name and key of a public key file's text.
fn public_of_text(text: &str, path: &Path) -> Result<(String, PublicKey), SecurityError> {
    let fields = parse_zpl(text, path)?;
    let p = fields
        .get("public-key")
        .ok_or_else(|| SecurityError::Malformed {
            path: path.into(),
            why: "no public-key line".into(),
        })?;
    let key = PublicKey::from_z85(p).map_err(|e| SecurityError::Malformed {
        path: path.into(),
        why: format!("public-key: {e}"),
    })?;
    // In a trust directory the file names the key, whatever it says.
    let name = stem(path, "pub")
        .or_else(|| fields.get("name").cloned())
        .filter(|n| valid_name(n))
        .unwrap_or_else(|| key.fingerprint());
    Ok((name, key))
}

/// The keys a node trusts: every `*.pub` file of a directory (like ssh's
/// `authorized_keys`), each named by its file.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    dir: PathBuf,
    by_key: HashMap<PublicKey, String>,
    by_name: BTreeMap<String, PublicKey>,
    /// Files skipped (unreadable or malformed), with why.
    skipped: Vec<(PathBuf, String)>,
}

impl Trust {
    /// Reads every `*.pub` file of `dir`. A file that is not a public key is
    /// skipped (listed by [`Trust::skipped`], and logged); a directory that
    /// cannot be read is an error.
    pub fn load(dir: &Path) -> Result<Trust, SecurityError> {
        let io = |source| SecurityError::Io {
            path: dir.into(),
            source,
        };
        let mut t = Trust {
            dir: dir.into(),
            ..Trust::default()
        };
        // Who may add a key: its owner alone (this user or root). A sticky
        // directory (as /tmp) lets others add files, so it is no better.
        let meta = fs::metadata(dir).map_err(io)?;
        let (owner, mode) = (meta.uid(), meta.mode() & 0o7777);
        let me = crate::util::sys::uid();
        if (owner != me && owner != 0) || mode & 0o022 != 0 {
            return Err(SecurityError::TrustWritable {
                path: dir.into(),
                owner,
                mode,
            });
        }
        let entries = trusted_files(dir).map_err(io)?;
        for path in entries {
            match load_public_checked(&path, me) {
                Ok((name, key)) => t.insert(name, key),
                Err(e) => t.skipped.push((path, e.to_string())),
            }
        }
        Ok(t)
    }

    fn insert(&mut self, name: String, key: PublicKey) {
        self.by_name.insert(name.clone(), key);
        self.by_key.entry(key).or_insert(name);
    }

    /// The name a trusted key goes by, or `None` if it is not trusted.
    pub fn name_of(&self, key: &PublicKey) -> Option<&str> {
        self.by_key.get(key).map(String::as_str)
    }

    /// The trusted key of `name` (a `.pub` file's name without `.pub`).
    pub fn key_of(&self, name: &str) -> Option<PublicKey> {
        self.by_name.get(name).copied()
    }

    /// How many keys are trusted.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether no key is trusted.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The directory read.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Files skipped, and why.
    pub fn skipped(&self) -> &[(PathBuf, String)] {
        &self.skipped
    }
}

/// What a trust directory looked like when read: each `.pub` file's name,
/// modification time (seconds, nanoseconds) and size. A change means a
/// reload.
type DirStamp = Vec<(PathBuf, i64, i64, u64)>;

fn dir_stamp(dir: &Path) -> DirStamp {
    // The directory's own: a file added, removed or renamed anywhere in
    // it, read or not; then the files read, each (an edit in place).
    let own = fs::metadata(dir)
        .map(|m| {
            (
                dir.to_path_buf(),
                m.mtime(),
                m.mtime_nsec(),
                m.mode().into(),
            )
        })
        .into_iter();
    let files = trusted_files(dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| {
            let m = fs::symlink_metadata(&p).ok()?;
            Some((p, m.mtime(), m.mtime_nsec(), m.len()))
        });
    own.chain(files).collect()
}

/// The `*.pub` files of a trust directory a node reads: the first
/// [`MAX_TRUSTED`] by name (the others are said, and not trusted).
fn trusted_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "pub"))
        .collect();
    entries.sort();
    if entries.len() > MAX_TRUSTED {
        limited!(warn, dir = %dir.display(), files = entries.len(), "trust directory: more key files than the {MAX_TRUSTED} a node reads; those after the first {MAX_TRUSTED} by name are not trusted");
        entries.truncate(MAX_TRUSTED);
    }
    Ok(entries)
}

/// [`load_public`] of a file in a trust directory, which must be writable
/// by its owner alone, this user (`me`) or root: a key file another user
/// may change is a key that user chooses.
fn load_public_checked(path: &Path, me: u32) -> Result<(String, PublicKey), SecurityError> {
    let (text, meta) = read_small_with(path)?;
    let (owner, mode) = (meta.uid(), meta.mode() & 0o7777);
    if (owner != me && owner != 0) || mode & 0o022 != 0 {
        return Err(SecurityError::Malformed {
            path: path.into(),
            why: format!("writable by others (uid {owner}, mode {mode:o}): not trusted"),
        });
    }
    public_of_text(&text, path)
}

/// A node's security: its identity, what it trusts (reloaded when the
/// directory changes), and the keys of the peers it may connect to.
pub(crate) struct Guard {
    pub(crate) identity: Identity,
    /// Its own key is always trusted (a node subscribes to itself).
    trust: RwLock<Trust>,
    stamp: Mutex<(Instant, DirStamp)>,
    /// The ZAP domain of the node's listening sockets.
    pub(crate) zap_domain: String,
    core: Weak<NodeCore>,
    /// The key of every endpoint of the trusted peers discovery shows (the
    /// server key a connection to it must name).
    peer_keys: Mutex<HashMap<String, PublicKey>>,
    /// Keys given with static peers (`NAME@tcp://…`), never forgotten.
    configured_keys: Mutex<HashMap<String, PublicKey>>,
    /// Keys told by gossip with the endpoints learned (bounded).
    static_keys: Mutex<HashMap<String, PublicKey>>,
    /// Untrusted peers already logged, by node id.
    untrusted: Mutex<std::collections::HashSet<String>>,
    /// The access control rules, if a file is given, and what the file
    /// looked like when read (reloaded when that changes).
    acl: RwLock<Option<Acl>>,
    acl_stamp: Mutex<Option<(i64, i64, u64)>>,
    /// With access control: the keys published on each data socket (by
    /// its number), every one of which a key must be allowed to subscribe
    /// to before the socket admits it (`admit`). Only grows: a key whose
    /// publisher went stays, which can only refuse more.
    data_keys: Mutex<BTreeMap<u32, BTreeSet<String>>>,
    /// A broker client: the broker's endpoints (without tags) and its key,
    /// the server key of every connection the node makes (docs/broker.md).
    broker: Mutex<Option<(std::collections::HashSet<String>, PublicKey)>>,
}

/// What a socket needs to connect as a CURVE client to a server whose key
/// is known: made where the node's identity is, applied on the thread
/// that owns the socket.
#[derive(Clone)]
pub(crate) struct ClientKeys {
    pub(crate) server: PublicKey,
    public: PublicKey,
    secret: [u8; KEY_BYTES],
}

impl std::fmt::Debug for ClientKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientKeys")
            .field("server", &self.server)
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl ClientKeys {
    /// `identity` connecting to a server holding `server`.
    pub(crate) fn new(identity: &Identity, server: PublicKey) -> ClientKeys {
        ClientKeys {
            server,
            public: identity.public,
            secret: identity.secret,
        }
    }

    /// Makes `sock` a CURVE client of the server for its next `connect`.
    pub(crate) fn apply(&self, sock: &zmq::Socket) -> zmq::Result<()> {
        sock.set_curve_serverkey(self.server.as_bytes())?;
        sock.set_curve_publickey(self.public.as_bytes())?;
        sock.set_curve_secretkey(&self.secret)
    }
}

/// A file's modification time and size, if it can be read.
fn file_stamp(path: &Path) -> Option<(i64, i64, u64)> {
    let m = fs::metadata(path).ok()?;
    Some((m.mtime(), m.mtime_nsec(), m.len()))
}

/// Most keys of static and learned peers remembered; beyond, the map
/// starts again (a learned peer is asked again, with the key it was told
/// with, when gossip tells it again).
const MAX_STATIC_KEYS: usize = 4096;

/// How often a node looks at its trust directory.
const TRUST_CHECK: Duration = Duration::from_secs(1);

impl Guard {
    pub(crate) fn new(
        core: &Arc<NodeCore>,
        identity: Identity,
        trust_dir: &Path,
        acl_file: Option<&Path>,
    ) -> Result<Arc<Guard>, SecurityError> {
        let acl_stamp = acl_file.and_then(file_stamp);
        let acl = acl_file.map(Acl::load).transpose()?;
        let stamp = dir_stamp(trust_dir);
        let mut trust = Trust::load(trust_dir)?;
        // The first ten said each, the others counted (ten thousand junk
        // files made ten thousand lines).
        for (path, why) in trust.skipped.iter().take(10) {
            tracing::warn!(file = %path.display(), %why, "trust directory: skipped a file that is not a public key");
        }
        if trust.skipped.len() > 10 {
            tracing::warn!(dir = %trust_dir.display(), more = trust.skipped.len() - 10, "trust directory: skipped more files that are not public keys");
        }
        trust.insert(identity.name.clone(), identity.public);
        let g = Arc::new(Guard {
            identity,
            trust: RwLock::new(trust),
            stamp: Mutex::new((Instant::now(), stamp)),
            zap_domain: format!("milonga-{}", core.id),
            core: Arc::downgrade(core),
            peer_keys: Mutex::default(),
            configured_keys: Mutex::default(),
            static_keys: Mutex::default(),
            untrusted: Mutex::default(),
            acl: RwLock::new(acl),
            acl_stamp: Mutex::new(acl_stamp),
            data_keys: Mutex::default(),
            broker: Mutex::default(),
        });
        register(&g);
        Ok(g)
    }

    /// The name `key` goes by if trusted.
    pub(crate) fn trusted(&self, key: &PublicKey) -> Option<String> {
        self.trust
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .name_of(key)
            .map(str::to_owned)
    }

    /// The trust directory it reads.
    pub(crate) fn trust_dir(&self) -> PathBuf {
        self.trust
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .dir()
            .to_path_buf()
    }

    /// The trusted key named `name`.
    pub(crate) fn key_named(&self, name: &str) -> Option<PublicKey> {
        self.trust
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .key_of(name)
    }

    /// Whether `key` (Z85, the `User-Id` of a connection) may do what
    /// `check` asks of the rules: always without a rules file; otherwise
    /// what the first allowing rule says (`Ok`) or why none does. The
    /// node's own identity is under the rules like any other.
    pub(crate) fn allowed(
        &self,
        key: Option<&str>,
        check: impl FnOnce(&Acl, Asker<'_>) -> Result<usize, String>,
    ) -> Result<(), String> {
        let acl = self.acl.read().unwrap_or_else(|e| e.into_inner());
        let Some(acl) = acl.as_ref() else {
            return Ok(());
        };
        let Some(key) = key else {
            return Err("the connection has no authenticated key".into());
        };
        let name = PublicKey::from_z85(key)
            .ok()
            .and_then(|k| self.trusted(&k))
            .unwrap_or_else(|| "?".into());
        check(acl, Asker { name: &name, key }).map(|_| ())
    }

    /// With access control, whether `key` may be served on data socket
    /// `socket`: whether the same `subscribe` rules cover it and every
    /// key published there (so the socket admits exactly the keys allowed
    /// to subscribe to it). Without: always.
    pub(crate) fn fits_data_socket(&self, socket: u32, key: &str) -> bool {
        let acl = self.acl.read().unwrap_or_else(|e| e.into_inner());
        let Some(acl) = acl.as_ref() else {
            return true;
        };
        let class = acl.subscribe_class(key);
        lock(&self.data_keys)
            .get(&socket)
            .is_none_or(|keys| keys.iter().all(|k| acl.subscribe_class(k) == class))
    }

    /// Notes that `key` is published on data socket `socket`.
    pub(crate) fn note_data_key(&self, socket: u32, key: &str) {
        lock(&self.data_keys)
            .entry(socket)
            .or_default()
            .insert(key.to_owned());
    }

    /// Forgets what was noted of data socket `socket` (it could not be made).
    pub(crate) fn forget_data_socket(&self, socket: u32) {
        lock(&self.data_keys).remove(&socket);
    }

    /// Whether `asker` may subscribe to every key published on data
    /// socket `socket` (to something, if none is noted yet).
    fn may_subscribe_to_socket(&self, socket: u32, key: &str) -> Result<(), String> {
        let keys: Vec<String> = lock(&self.data_keys)
            .get(&socket)
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default();
        self.allowed(Some(key), |acl, who| match keys.is_empty() {
            true => acl.may_subscribe(who),
            false => keys.iter().try_fold(0, |_, k| {
                acl.check(who, crate::model::acl::Operation::Subscribe, k)
            }),
        })
    }

    /// Whether a rules file is in force.
    pub(crate) fn has_acl(&self) -> bool {
        self.acl.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Reads the rules file again if it changed; a file that no longer
    /// parses keeps the rules read before (logged).
    fn refresh_acl(&self) -> bool {
        let path = match &*self.acl.read().unwrap_or_else(|e| e.into_inner()) {
            Some(a) => a.path().to_path_buf(),
            None => return false,
        };
        let now = file_stamp(&path);
        let mut stamp = lock(&self.acl_stamp);
        if now == *stamp {
            return false;
        }
        *stamp = now;
        match Acl::load(&path) {
            Ok(a) => {
                tracing::info!(file = %path.display(), "access control rules changed: reloaded");
                *self.acl.write().unwrap_or_else(|e| e.into_inner()) = Some(a);
                true
            }
            Err(e) => {
                limited!(warn, %e, "access control rules unreadable: keeping the rules read before");
                false
            }
        }
    }

    /// Reads the trust directory and the rules file again if they changed
    /// (checked at most once a second; the node thread calls this every
    /// turn). Whether either did.
    pub(crate) fn refresh(&self) -> bool {
        let mut st = lock(&self.stamp);
        if st.0.elapsed() < TRUST_CHECK {
            return false;
        }
        st.0 = Instant::now();
        let acl_changed = self.refresh_acl();
        let dir = self
            .trust
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .dir
            .clone();
        let now = dir_stamp(&dir);
        if now == st.1 {
            return acl_changed;
        }
        st.1 = now;
        match Trust::load(&dir) {
            Ok(mut t) => {
                for (path, why) in &t.skipped {
                    limited!(warn, file = %path.display(), %why, "trust directory: skipped a file that is not a public key");
                }
                t.insert(self.identity.name.clone(), self.identity.public);
                tracing::info!(dir = %dir.display(), keys = t.len(), "trust directory changed: reloaded (new connections only)");
                *self.trust.write().unwrap_or_else(|e| e.into_inner()) = t;
                true
            }
            Err(e) => {
                limited!(warn, dir = %dir.display(), %e, "trust directory unreadable: keeping the keys read before");
                false
            }
        }
    }

    /// Keeps of `peers` those announcing a trusted key, and learns the key
    /// of each of their endpoints. The others are counted
    /// (`peers_untrusted`) and logged once each: this node neither
    /// connects to them nor lists them.
    pub(crate) fn admit_peers(
        &self,
        peers: &mut BTreeMap<String, Announcement>,
    ) -> Vec<(Announcement, String)> {
        let mut keys = HashMap::new();
        let mut untrusted = lock(&self.untrusted);
        let mut excluded = Vec::new();
        peers.retain(|id, a| {
            let key = a.key.as_deref().map(PublicKey::from_z85);
            // A broker's client shown to its host: reached at the broker's
            // sockets with the broker's key, which must be this node's own
            // (the only relay it designates, docs/security.md).
            let via = a.via.as_deref().map(PublicKey::from_z85);
            let relay_ok = match &via {
                None => true,
                Some(Ok(v)) => *v == self.identity.public,
                Some(Err(_)) => false,
            };
            match key {
                Some(Ok(k)) if self.trusted(&k).is_some() && relay_ok => {
                    let reached = match via {
                        Some(Ok(v)) => v,
                        _ => k,
                    };
                    for ep in endpoints_of(a) {
                        // Its own control socket, if any, holds its own key.
                        let server = if ep == a.control { k } else { reached };
                        keys.insert(ep.to_owned(), server);
                    }
                    self.filter_offers(id, a, &k, &mut untrusted);
                    true
                }
                other => {
                    let why = match other {
                        None => "it announces no key (its security is off)".to_owned(),
                        Some(Err(e)) => format!("its key is malformed: {e}"),
                        Some(Ok(k)) if self.trusted(&k).is_none() => {
                            format!("its key {} is not in the trust directory", k.fingerprint())
                        }
                        Some(Ok(_)) => format!(
                            "it is a broker's client shown through the broker key {}, which is not this node's own (the one relay a node designates)",
                            a.via.as_deref().unwrap_or_default()
                        ),
                    };
                    if untrusted.len() < 4096 && untrusted.insert(id.clone()) {
                        if let Some(core) = self.core.upgrade() {
                            core.counters
                                .peers_untrusted
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        limited!(warn, node = %a.name, %why, "not connecting to a peer");
                    }
                    excluded.push((a.clone(), why));
                    false
                }
            }
        });
        *lock(&self.peer_keys) = keys;
        excluded
    }

    /// Counts and logs (once per node id) an announcement that does not
    /// name a node of its key ([`attributed`]).
    pub(crate) fn note_unattributed(&self, a: &Announcement, why: &str) {
        let mut seen = lock(&self.untrusted);
        if seen.len() < 4096 && seen.insert(format!("id:{}", a.node_id)) {
            if let Some(core) = self.core.upgrade() {
                core.counters
                    .peers_unattributed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            limited!(warn, node = %a.name, id = %a.node_id, %why, "not connecting to a peer");
        }
    }

    /// Drops from `a` (the announcement of node `id`, whose key is `k`) the
    /// publications its key may not `put` and the services it may not
    /// `serve` under the rules: this node neither subscribes to nor calls
    /// them. Each is counted (`acl_ignored`) and logged once.
    fn filter_offers(
        &self,
        id: &str,
        a: &mut Announcement,
        k: &PublicKey,
        seen: &mut std::collections::HashSet<String>,
    ) {
        use crate::model::acl::Operation;
        if !self.has_acl() {
            return;
        }
        let key = k.to_z85();
        let mut note = |what: &str, why: &str| {
            if seen.len() < 4096 && seen.insert(format!("acl:{id}:{what}")) {
                if let Some(core) = self.core.upgrade() {
                    core.counters
                        .acl_ignored
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                limited!(warn, node = %a.name, %what, %why, "access control: ignoring what a peer offers");
            }
        };
        a.publications.retain(|p| {
            let ok = self.allowed(Some(&key), |acl, who| {
                acl.check(who, Operation::Put, &p.key)
            });
            ok.map_err(|why| note(&format!("put {}", p.key), &why))
                .is_ok()
        });
        a.services.retain(|s| {
            let ok = self.allowed(Some(&key), |acl, who| {
                acl.check(who, Operation::Serve, &s.key)
            });
            ok.map_err(|why| note(&format!("serve {}", s.key), &why))
                .is_ok()
        });
    }

    /// Remembers the key of a configured static peer's control endpoint.
    pub(crate) fn set_configured_key(&self, endpoint: &str, key: PublicKey) {
        lock(&self.configured_keys).insert(endpoint.to_owned(), key);
    }

    /// Remembers the key of a control endpoint learned by gossip (at most
    /// [`MAX_STATIC_KEYS`]: beyond, they are forgotten and learned again
    /// when told again). A configured peer's key is never replaced.
    pub(crate) fn set_static_key(&self, endpoint: &str, key: PublicKey) {
        if lock(&self.configured_keys).contains_key(endpoint) {
            return;
        }
        let mut m = lock(&self.static_keys);
        if m.len() >= MAX_STATIC_KEYS && !m.contains_key(endpoint) {
            m.clear();
        }
        m.insert(endpoint.to_owned(), key);
    }

    /// A broker client: every connection to one of `endpoints` (the
    /// broker's, told by its hello) names `key`, the broker's, whatever
    /// node is announced there (the broker vouches for the frames of the
    /// nodes it serves: docs/broker.md).
    pub(crate) fn set_broker(&self, endpoints: impl IntoIterator<Item = String>, key: PublicKey) {
        *lock(&self.broker) = Some((endpoints.into_iter().collect(), key));
    }

    /// Whether `endpoint` (tagged or not) is one of the broker's.
    pub(crate) fn brokered(&self, endpoint: &str) -> bool {
        let untagged = crate::backend::p2p::uplink::untagged(endpoint);
        lock(&self.broker)
            .as_ref()
            .is_some_and(|(eps, _)| eps.contains(untagged))
    }

    /// The server key a connection to `endpoint` must name, if known.
    pub(crate) fn key_for(&self, endpoint: &str) -> Option<PublicKey> {
        let untagged = crate::backend::p2p::uplink::untagged(endpoint);
        if let Some((eps, key)) = &*lock(&self.broker) {
            if eps.contains(untagged) {
                return Some(*key);
            }
        }
        let configured = lock(&self.configured_keys).get(endpoint).copied();
        let learned = || lock(&self.peer_keys).get(endpoint).copied();
        configured
            .or_else(learned)
            .or_else(|| lock(&self.static_keys).get(endpoint).copied())
    }

    fn refuse(&self, key: &PublicKey, address: &str) {
        if let Some(core) = self.core.upgrade() {
            core.counters
                .auth_refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        limited!(warn, key = %key, fingerprint = %key.fingerprint(), %address, "refused a connection: its key is not in the trust directory");
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut reg = lock(&REGISTRY);
        // (The data sockets' domain is this one with a suffix.)
        if reg
            .get(&self.zap_domain)
            .is_some_and(|w| w.strong_count() == 0)
        {
            reg.remove(&self.zap_domain);
        }
    }
}

/// Makes `sock` a CURVE client for its next `connect`, to `endpoint`, when
/// `guard` is there (security on): the server key is the one known for
/// `endpoint` (announced by a trusted peer, or given with a static peer),
/// else this node's own. An inproc endpoint needs none (no handshake
/// within a process).
pub(crate) fn secure_client(
    guard: Option<&Guard>,
    sock: &zmq::Socket,
    endpoint: &str,
) -> Result<(), crate::model::error::TransportError> {
    match (guard, server_key(guard, endpoint)) {
        (Some(g), Some(server)) => secure_client_to(g, sock, server),
        _ => Ok(()),
    }
}

/// Makes `sock`, a socket that binds, a CURVE server of `g`'s identity
/// whose connections the ZAP handler judges under `zap_domain` (before
/// `bind`).
pub(crate) fn secure_server(
    g: &Guard,
    sock: &mut zmq::Socket,
    zap_domain: &str,
) -> zmq::Result<()> {
    sock.set_curve_server(true)?;
    sock.set_curve_secretkey(g.identity.secret())?;
    sock.set_zap_domain(zap_domain)?;
    crate::backend::p2p::zmq_io::set_zap_enforce(sock)
}

/// The server key a connection to `endpoint` names: none with security
/// off or for `inproc://` (no handshake). An endpoint no peer announced
/// is this node's own (a subscription to its own publications: its
/// announcement is not among the peers'), or one of a node of its own
/// identity: this node's key. A server that does not hold the secret key
/// of the key named fails the handshake.
pub(crate) fn server_key(guard: Option<&Guard>, endpoint: &str) -> Option<PublicKey> {
    let g = guard?;
    if endpoint.starts_with("inproc://") {
        return None;
    }
    Some(g.key_for(endpoint).unwrap_or(g.identity.public))
}

/// Makes `sock` a CURVE client of the server whose key is `server`, which
/// must be trusted.
pub(crate) fn secure_client_to(
    g: &Guard,
    sock: &zmq::Socket,
    server: PublicKey,
) -> Result<(), crate::model::error::TransportError> {
    use crate::model::error::{IntoTransport, TransportError};
    if g.trusted(&server).is_none() {
        return Err(TransportError::new(
            format!(
                "the key {} is not in the trust directory",
                server.fingerprint()
            ),
            None,
        ));
    }
    ClientKeys::new(&g.identity, server)
        .apply(sock)
        .map_err(IntoTransport::transport)
}

/// A static peer as configured: `tcp://HOST:PORT`, or `WHO@tcp://HOST:PORT`
/// where `WHO` names its key (a `.pub` file's name in the trust directory,
/// or the key itself in Z85). The name (if any) and the endpoint.
pub(crate) fn split_peer(spec: &str) -> (Option<&str>, &str) {
    // A Z85 key may hold '@', ':' and '/': it is known by its length.
    if spec.len() > Z85_KEY_CHARS + 1
        && spec.as_bytes()[Z85_KEY_CHARS] == b'@'
        && spec.is_char_boundary(Z85_KEY_CHARS)
        && spec[Z85_KEY_CHARS + 1..].contains("://")
        && PublicKey::from_z85(&spec[..Z85_KEY_CHARS]).is_ok()
    {
        return (Some(&spec[..Z85_KEY_CHARS]), &spec[Z85_KEY_CHARS + 1..]);
    }
    // A name has no '@'.
    match spec.split_once('@') {
        Some((who, ep)) if !who.contains("://") && ep.contains("://") => (Some(who), ep),
        _ => (None, spec),
    }
}

/// The key `who` names: a trusted key's name, or a Z85 key.
pub(crate) fn resolve_key(guard: &Guard, who: &str) -> Option<PublicKey> {
    guard
        .key_named(who)
        .or_else(|| PublicKey::from_z85(who).ok())
}

/// Whether announcement `a` names a node of the key it announces: its
/// `node_id` is the one that key and its `id_salt` give (`NodeId::keyed`,
/// docs/protocol.md §9.2), or why not. One without a key, or with a
/// malformed one, passes here: [`Guard::admit_peers`] says why it is not
/// connected to.
pub(crate) fn attributed(a: &Announcement) -> Result<(), String> {
    let Some(Ok(key)) = a.key.as_deref().map(PublicKey::from_z85) else {
        return Ok(());
    };
    let salt = a
        .id_salt
        .as_deref()
        .and_then(milonga_wire::NodeId::from_hex)
        .ok_or_else(|| {
            "it gives no id_salt binding its node id to its key (a build before node ids were keyed)"
                .to_owned()
        })?;
    if milonga_wire::NodeId::keyed(key.as_bytes(), &salt.0).to_hex() != a.node_id {
        return Err(format!(
            "its node id is not the one its key {} and id_salt give: it claims a node id that is not its own",
            key.fingerprint()
        ));
    }
    Ok(())
}

/// Whether announcement `a` names a well-formed key (with security on,
/// one that does not is never connected to).
pub(crate) fn has_key(a: &Announcement) -> bool {
    matches!(a.key.as_deref().map(PublicKey::from_z85), Some(Ok(_)))
}

/// Every endpoint an announcement names.
fn endpoints_of(a: &Announcement) -> impl Iterator<Item = &str> {
    [Some(a.control.as_str()), a.liveliness.as_deref()]
        .into_iter()
        .flatten()
        .chain(a.data_endpoints())
        .chain(a.services.iter().map(|s| s.endpoint.as_str()))
}

/// The guards of this process's secured nodes, by ZAP domain.
static REGISTRY: Mutex<BTreeMap<String, Weak<Guard>>> = Mutex::new(BTreeMap::new());

fn register(g: &Arc<Guard>) {
    lock(&REGISTRY).insert(g.zap_domain.clone(), Arc::downgrade(g));
}

/// What follows a node's ZAP domain, before the socket's number, in the
/// ZAP domain of its data sockets.
pub(crate) const DATA_DOMAIN_INFIX: &str = "-data-";

/// The ZAP verdict on a connection to a socket of ZAP domain `domain` by a
/// client presenting `key` (RFC 27): the key in Z85 (the connection's user
/// id), or why not. A data socket (its domain `<node's>-data-<number>`) of
/// a node with access control admits only keys allowed to subscribe to
/// every key published on it: libzmq's XPUB cannot refuse one
/// subscription of a connection soundly, so keys that different
/// `subscribe` rules cover are published on different sockets, and this
/// is where `subscribe` is decided (docs/security.md).
pub(crate) fn admit(domain: &str, key: &[u8], address: &str) -> Result<String, &'static str> {
    let Ok(key) = <[u8; KEY_BYTES]>::try_from(key) else {
        return Err("not a CURVE key");
    };
    let key = PublicKey(key);
    let (node, data) = match domain.rsplit_once(DATA_DOMAIN_INFIX) {
        Some((node, n)) => match n.parse::<u32>() {
            Ok(n) => (node, Some(n)),
            Err(_) => return Err("no such socket"),
        },
        None => (domain, None),
    };
    let guard = lock(&REGISTRY).get(node).and_then(Weak::upgrade);
    let Some(guard) = guard else {
        return Err("no such node");
    };
    if guard.trusted(&key).is_none() {
        guard.refuse(&key, address);
        return Err("key not trusted");
    }
    let z = key.to_z85();
    if let Some(socket) = data {
        if let Err(why) = guard.may_subscribe_to_socket(socket, &z) {
            if let Some(core) = guard.core.upgrade() {
                core.counters
                    .acl_denied
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            limited!(warn, key = %key.fingerprint(), %address, %why, "access control refused a subscriber's connection");
            return Err("no rule lets this key subscribe to the keys published here");
        }
    }
    Ok(z)
}

#[cfg(test)]
fn z85(bytes: &[u8; KEY_BYTES]) -> String {
    encode_key(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("milonga-curve-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_written_identity_loads_back_with_its_modes() {
        let dir = tmp("write");
        let id = Identity::generate("alice").unwrap();
        let (key, public) = id.write(&dir).unwrap();
        assert_eq!(
            fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::metadata(&public).unwrap().permissions().mode() & 0o777,
            0o644
        );
        let back = Identity::load(&key).unwrap();
        assert_eq!(back.name(), "alice");
        assert_eq!(back.public(), id.public());
        assert_eq!(back.secret(), id.secret());
        let (name, p) = load_public(&public).unwrap();
        assert_eq!((name.as_str(), p), ("alice", id.public()));
        assert!(matches!(id.write(&dir), Err(SecurityError::Exists(_))));
        // The secret appears nowhere in Debug.
        assert!(!format!("{id:?}").contains(&z85(id.secret())));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_announcement_is_attributed_only_if_its_key_gives_its_node_id() {
        let id = Identity::generate("alice").unwrap();
        let salt = [5u8; 16];
        let node = milonga_wire::NodeId::keyed(id.public().as_bytes(), &salt);
        let mut a = crate::engine::routes::test_announcement(1, 1, &[]);
        a.node_id = node.to_hex();
        a.key = Some(id.public().to_z85());
        a.id_salt = Some(milonga_wire::NodeId(salt).to_hex());
        assert_eq!(attributed(&a), Ok(()));
        // Another key claiming that id, with the same salt or any other.
        let mallory = Identity::generate("mallory").unwrap();
        let mut claim = a.clone();
        claim.key = Some(mallory.public().to_z85());
        assert!(attributed(&claim).unwrap_err().contains("not its own"));
        claim.id_salt = Some("11".repeat(16));
        assert!(attributed(&claim).is_err());
        // No salt: an older build, not attributed.
        let mut old = a.clone();
        old.id_salt = None;
        assert!(attributed(&old).unwrap_err().contains("no id_salt"));
        // No key: not judged here (admit_peers says why not).
        old.key = None;
        assert_eq!(attributed(&old), Ok(()));
        // The id is a function of key and salt alone.
        assert_eq!(
            milonga_wire::NodeId::keyed(id.public().as_bytes(), &salt),
            node
        );
        assert_ne!(
            milonga_wire::NodeId::keyed(id.public().as_bytes(), &[6; 16]),
            node
        );
    }

    #[test]
    fn bad_key_files_are_clear_errors() {
        let dir = tmp("bad");
        let id = Identity::generate("bob").unwrap();
        let (key, public) = id.write(&dir).unwrap();
        // Readable by others.
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            Identity::load(&key),
            Err(SecurityError::Permissions { .. })
        ));
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        // A public key file is not an identity.
        let e = Identity::load(&public).unwrap_err().to_string();
        assert!(e.contains("no secret-key"), "{e}");
        // A corrupt secret: the public key no longer matches.
        let text = fs::read_to_string(&key).unwrap();
        let s = z85(id.secret());
        let mut flipped = s.clone().into_bytes();
        flipped[5] = if flipped[5] == b'a' { b'b' } else { b'a' };
        fs::write(
            &key,
            text.replace(&s, std::str::from_utf8(&flipped).unwrap()),
        )
        .unwrap();
        assert!(matches!(
            Identity::load(&key),
            Err(SecurityError::Mismatch { .. })
        ));
        // Truncated: not a key.
        fs::write(&key, "curve\n    secret-key = \"abc\"\n").unwrap();
        let e = Identity::load(&key).unwrap_err().to_string();
        assert!(e.contains("secret-key") && e.contains("characters"), "{e}");
        assert!(Identity::generate("../x").is_err());
        assert!(matches!(
            Identity::load(&dir.join("missing.key")),
            Err(SecurityError::Io { .. })
        ));
        // A link is not followed, and the error says so (it said "Too
        // many levels of symbolic links").
        let good = Identity::generate("carol").unwrap().write(&dir).unwrap().0;
        let link = dir.join("link.key");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let e = Identity::load(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link, not followed"), "{e}");
        // Another user's secret key (that user controls the identity):
        // refused. Only root can give a file away; as another user this
        // part has nothing to try.
        if crate::util::sys::uid() == 0 {
            std::os::unix::fs::chown(&good, Some(65534), None).unwrap();
            assert!(
                matches!(
                    Identity::load(&good),
                    Err(SecurityError::Owner { owner: 65534, .. })
                ),
                "{:?}",
                Identity::load(&good).map(|_| ())
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_trust_directory_names_its_keys_and_skips_what_is_not_one() {
        let dir = tmp("trust");
        let a = Identity::generate("a").unwrap();
        let b = Identity::generate("b").unwrap();
        a.write(&dir).unwrap();
        b.write(&dir).unwrap();
        fs::write(dir.join("junk.pub"), "hello").unwrap();
        let t = Trust::load(&dir).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.name_of(&a.public()), Some("a"));
        assert_eq!(t.key_of("b"), Some(b.public()));
        assert_eq!(t.skipped().len(), 1);
        assert!(Trust::load(&dir.join("nope")).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Whoever may write the trust directory or one of its key files
    /// chooses who is trusted: a directory writable by others (group or
    /// all, sticky or not) is refused, a key file writable by others is
    /// skipped; as root, a key file of another user is skipped too. They
    /// were trusted silently. A file removed from the directory, wherever
    /// it sorts, is seen (past the first 10,001 files read it was not).
    #[test]
    fn a_trust_directory_others_may_write_is_refused_and_so_are_their_key_files() {
        let dir = tmp("trust-perm");
        let a = Identity::generate("a").unwrap();
        let b = Identity::generate("b").unwrap();
        let c = Identity::generate("c").unwrap();
        a.write(&dir).unwrap();
        b.write(&dir).unwrap();
        c.write(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(Trust::load(&dir).unwrap().len(), 3);
        for mode in [0o777, 0o1777, 0o770, 0o720] {
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
            assert!(
                matches!(Trust::load(&dir), Err(SecurityError::TrustWritable { .. })),
                "mode {mode:o}"
            );
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(dir.join("b.pub"), fs::Permissions::from_mode(0o666)).unwrap();
        if crate::util::sys::uid() == 0 {
            std::os::unix::fs::chown(dir.join("c.pub"), Some(65534), None).unwrap();
        }
        let t = Trust::load(&dir).unwrap();
        assert_eq!(t.name_of(&a.public()), Some("a"));
        assert_eq!(t.name_of(&b.public()), None, "writable by all");
        if crate::util::sys::uid() == 0 {
            assert_eq!(t.name_of(&c.public()), None, "another user's");
        }
        assert!(t
            .skipped()
            .iter()
            .any(|(p, why)| p.ends_with("b.pub") && why.contains("writable by others")));
        // Removing a file changes the stamp (the directory's own time).
        let before = dir_stamp(&dir);
        fs::remove_file(dir.join("a.pub")).unwrap();
        assert_ne!(dir_stamp(&dir), before);
        fs::remove_dir_all(&dir).unwrap();
    }
}
