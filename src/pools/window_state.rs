//! The hand-off windows in force, kept in a file (`state_file`) so that a
//! restart takes them up again: a sidecar restarted inside a window (a
//! deploy, a crash loop, SIGKILL) still reads moved keys through from their
//! previous owners and still deletes written keys there, as the sidecars
//! beside it do. Without it, a delete through the restarted sidecar reaches
//! only the new owner, and another sidecar still in its window reads the
//! previous owner's value back (docs/handoff.md, "Restarts").
//!
//! The file is written when a pool's window starts, changes or ends (never
//! only at shutdown: SIGKILL), by the pool's publisher on the control plane,
//! before the topology it describes is published, atomically (a temporary
//! file, fsync, rename). It holds, per pool, the ring in force, the previous
//! ring and the older rings of the chain (flavour, hash, hash tag, the
//! prefix hashed without, and the servers with their addresses and
//! weights), the servers of dropped rings, the deadline as Unix time and
//! whether the sweep has run.
//!
//! Reading it at start never blocks and never takes more than
//! [`MAX_STATE_BYTES`]: a FIFO or a device is refused unopened (and opened
//! non-blocking in case it was swapped in between), and the read is capped.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::config::ServerConfig;
use crate::ring::{Flavour, HashFunction, Ring, Spec};
use crate::stats::Stats;

/// The file format's version; a file of another version is not read.
pub const FORMAT_VERSION: u32 = 1;

/// Largest state file read. A window keeps at most five rings per pool, a
/// few hundred bytes per server each: this is room for thousands of servers.
pub const MAX_STATE_BYTES: u64 = 8 << 20;

/// One server of a saved ring.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SavedServer {
    pub name: String,
    pub addr: String,
    pub weight: u32,
    #[serde(default)]
    pub tls: bool,
    /// Its zone, which places replicas (absent in files from before zones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// A saved ring: everything that decides where keys go.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SavedRing {
    /// The flavour (`ring = …`).
    pub ring: String,
    /// The key hash (`hash = …`).
    pub hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_tag: Option<String>,
    /// `hash_without_prefix`, when set: a previous ring rebuilt after a
    /// restart must hash keys as it did, or hand-off would ask the wrong
    /// previous owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_without_prefix: Option<String>,
    /// The members, in member order.
    pub servers: Vec<SavedServer>,
}

impl SavedRing {
    /// The ring `spec` builds over `servers`.
    pub fn of(spec: &Spec, servers: &[ServerConfig]) -> SavedRing {
        SavedRing {
            ring: spec.flavour.name().to_string(),
            hash: spec.hash.name().to_string(),
            hash_tag: spec
                .hash_tag
                .map(|[open, close]| String::from_utf8_lossy(&[open, close]).into_owned()),
            hash_without_prefix: (!spec.hash_without_prefix.is_empty())
                .then(|| String::from_utf8_lossy(&spec.hash_without_prefix).into_owned()),
            servers: servers
                .iter()
                .map(|s| SavedServer {
                    name: s.name.clone(),
                    addr: s.addr.clone(),
                    weight: s.weight,
                    tls: s.tls,
                    zone: s.zone.clone(),
                })
                .collect(),
        }
    }

    /// The flavour, hash, hash tag and prefix hashed without.
    ///
    /// # Errors
    /// A name memring does not know, or a hash tag that is not two bytes.
    pub fn spec(&self) -> Result<Spec, String> {
        let flavour = Flavour::from_name(&self.ring)
            .ok_or_else(|| format!("unknown ring flavour {:?}", self.ring))?;
        let hash = HashFunction::from_name(&self.hash)
            .ok_or_else(|| format!("unknown hash {:?}", self.hash))?;
        let hash_tag = match &self.hash_tag {
            None => None,
            Some(tag) => match tag.as_bytes() {
                [open, close] => Some([*open, *close]),
                _ => return Err(format!("hash tag {tag:?} is not two characters")),
            },
        };
        let hash_without_prefix = self
            .hash_without_prefix
            .as_deref()
            .unwrap_or_default()
            .as_bytes()
            .into();
        Ok(Spec {
            flavour,
            hash,
            hash_tag,
            hash_without_prefix,
        })
    }

    /// The members as servers.
    pub fn server_configs(&self) -> Vec<ServerConfig> {
        self.servers.iter().map(SavedServer::config).collect()
    }

    /// Member names, in member order.
    pub fn members(&self) -> Box<[String]> {
        self.servers.iter().map(|s| s.name.clone()).collect()
    }

    /// The ring itself.
    ///
    /// # Errors
    /// As [`SavedRing::spec`], and a ring without servers or with a server
    /// twice.
    pub fn build(&self) -> Result<Ring, String> {
        let spec = self.spec()?;
        if self.servers.is_empty() {
            return Err("a ring without servers".into());
        }
        for (i, server) in self.servers.iter().enumerate() {
            if self.servers[..i].iter().any(|s| s.name == server.name) {
                return Err(format!("server {:?} twice in one ring", server.name));
            }
            if server.weight == 0 {
                return Err(format!("server {:?} has weight 0", server.name));
            }
        }
        let nodes = self.servers.iter().map(|s| s.config().node()).collect();
        Ok(Ring::build_with(&spec, nodes))
    }
}

impl SavedServer {
    fn config(&self) -> ServerConfig {
        ServerConfig {
            weight: self.weight,
            tls: self.tls,
            zone: self.zone.clone(),
            ..ServerConfig::plain(self.name.clone(), self.addr.clone())
        }
    }
}

/// One pool's hand-off window.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SavedWindow {
    /// When the window's time is up, in seconds since the epoch.
    pub until_unix: u64,
    /// Its sweep has run: the window is over once its time is up.
    #[serde(default)]
    pub swept: bool,
    /// A change of the chain was undone (see `Topology::copies_back`).
    #[serde(default)]
    pub undoes: bool,
    /// The ring in force.
    pub ring: SavedRing,
    /// The ring before it.
    pub previous: SavedRing,
    /// The older rings of the chain, newest first.
    #[serde(default)]
    pub older: Vec<SavedRing>,
    /// The servers of rings dropped from the chain.
    #[serde(default)]
    pub dropped: Vec<SavedServer>,
}

impl SavedWindow {
    /// Every server the window names, each once (the first spelling found,
    /// from the ring in force on).
    pub fn servers(&self) -> Vec<ServerConfig> {
        let mut out: Vec<ServerConfig> = Vec::new();
        let rings = std::iter::once(&self.ring)
            .chain(std::iter::once(&self.previous))
            .chain(self.older.iter());
        let all = rings
            .flat_map(|r| r.servers.iter())
            .chain(self.dropped.iter());
        for server in all {
            if !out.iter().any(|s| s.name == server.name) {
                out.push(server.config());
            }
        }
        out
    }
}

/// The file as written.
#[derive(Serialize, Deserialize, Debug)]
struct StateText {
    version: u32,
    /// When it was written (for people reading it).
    #[serde(default)]
    written_unix: u64,
    #[serde(default)]
    pools: BTreeMap<String, SavedWindow>,
}

/// What the file held at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// No file: a first start, or memring never had a window.
    Missing,
    /// The windows in force when it was written, by pool (none: no window).
    Windows(BTreeMap<String, SavedWindow>),
    /// It could not be used, for this reason.
    Unusable(String),
}

/// Reads the state file at `path`, without blocking and within
/// [`MAX_STATE_BYTES`].
pub fn load(path: &Path) -> Loaded {
    match read_capped(path) {
        Ok(None) => Loaded::Missing,
        Ok(Some(text)) => parse(&text).map_or_else(Loaded::Unusable, Loaded::Windows),
        Err(reason) => Loaded::Unusable(reason),
    }
}

/// The windows of a state file's text.
///
/// # Errors
/// Not the format, or another version of it.
pub fn parse(text: &str) -> Result<BTreeMap<String, SavedWindow>, String> {
    #[derive(Deserialize)]
    struct Version {
        version: Option<u32>,
    }
    let version: Version =
        toml::from_str(text).map_err(|e| format!("not a state file: {}", first_line(&e)))?;
    match version.version {
        Some(FORMAT_VERSION) => {}
        Some(other) => {
            return Err(format!(
                "format version {other}, this memring reads version {FORMAT_VERSION}"
            ))
        }
        None => return Err("no format version".into()),
    }
    let state: StateText =
        toml::from_str(text).map_err(|e| format!("not a state file: {}", first_line(&e)))?;
    for (pool, window) in &state.pools {
        for ring in std::iter::once(&window.ring)
            .chain(std::iter::once(&window.previous))
            .chain(window.older.iter())
        {
            ring.build().map_err(|e| format!("pool {pool}: {e}"))?;
        }
    }
    Ok(state.pools)
}

fn first_line(error: &toml::de::Error) -> String {
    error.to_string().lines().next().unwrap_or("").to_string()
}

/// The file's text; `None` when there is no file. Read as the control
/// plane reads its other files (`regular_file`): a FIFO or a device is
/// refused without waiting, and no more than [`MAX_STATE_BYTES`] is read.
fn read_capped(path: &Path) -> Result<Option<String>, String> {
    match crate::inputs::regular_file::read_to_string(path, MAX_STATE_BYTES) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The state file of a running memring: every pool's window, written
/// whenever one changes.
pub struct StateFile {
    path: PathBuf,
    /// The windows last written (or to be written), by pool.
    windows: Mutex<Written>,
    /// The last write failed: logged once until one succeeds.
    failing: AtomicBool,
    stats: Arc<Stats>,
}

#[derive(Default)]
struct Written {
    pools: BTreeMap<String, SavedWindow>,
    /// What the file holds (`None`: not written by this process yet).
    on_disk: Option<BTreeMap<String, SavedWindow>>,
}

impl StateFile {
    pub fn new(path: PathBuf, stats: Arc<Stats>) -> Arc<StateFile> {
        Arc::new(StateFile {
            path,
            windows: Mutex::new(Written::default()),
            failing: AtomicBool::new(false),
            stats,
        })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Pool `pool`'s window is now `window` (`None`: none); the file is
    /// rewritten if that changes what it holds. A window whose sweep had
    /// run stays marked so while it is the same window.
    pub fn record(&self, pool: &str, window: Option<SavedWindow>) {
        let mut written = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        match window {
            Some(mut window) => {
                if let Some(old) = written.pools.get(pool) {
                    window.swept |= old.swept && same_window(old, &window);
                }
                written.pools.insert(pool.to_string(), window);
            }
            None => {
                written.pools.remove(pool);
            }
        }
        self.flush(&mut written);
    }

    /// Pool `pool`'s window has been swept: it ends at the next look.
    pub fn swept(&self, pool: &str) {
        let mut written = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(window) = written.pools.get_mut(pool) {
            window.swept = true;
        }
        self.flush(&mut written);
    }

    fn flush(&self, written: &mut Written) {
        if written.on_disk.as_ref() == Some(&written.pools) {
            return;
        }
        match self.write(&written.pools) {
            Ok(()) => {
                written.on_disk = Some(written.pools.clone());
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("hand-off state written to {} again", self.path.display());
                }
            }
            Err(e) => {
                self.stats.state_error();
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "cannot write the hand-off state file {}: {e}; serving on, but a restart will not know the windows in force (set state_file to a writable path)",
                        self.path.display()
                    );
                }
            }
        }
    }

    /// Writes `pools` atomically: a temporary file beside the state file,
    /// synced, renamed over it, and the directory synced.
    fn write(&self, pools: &BTreeMap<String, SavedWindow>) -> std::io::Result<()> {
        let text = toml::to_string(&StateText {
            version: FORMAT_VERSION,
            written_unix: crate::runtime::clock::unix_now(),
            pools: pools.clone(),
        })
        .map_err(std::io::Error::other)?;
        let text = format!(
            "# memring's hand-off windows in force (docs/handoff.md, \"Restarts\"). Written by memring; do not edit.\n{text}"
        );
        let mut temporary = self.path.clone().into_os_string();
        temporary.push(".tmp");
        let temporary = PathBuf::from(temporary);
        let result = (|| {
            let mut file = std::fs::File::create(&temporary)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&temporary, &self.path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        result?;
        if let Some(dir) = self.path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            if let Ok(dir) = std::fs::File::open(dir) {
                let _ = dir.sync_all();
            }
        }
        Ok(())
    }
}

/// Whether two saved windows are the same window (its swept mark aside).
fn same_window(a: &SavedWindow, b: &SavedWindow) -> bool {
    SavedWindow {
        swept: false,
        ..a.clone()
    } == SavedWindow {
        swept: false,
        ..b.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(servers: &[&str]) -> SavedRing {
        let servers: Vec<ServerConfig> = servers
            .iter()
            .map(|a| ServerConfig::plain(*a, *a))
            .collect();
        SavedRing::of(&Spec::default(), &servers)
    }

    fn window() -> SavedWindow {
        SavedWindow {
            until_unix: 1_900_000_000,
            swept: false,
            undoes: true,
            ring: ring(&["a:1", "b:1", "c:1"]),
            previous: ring(&["a:1", "b:1"]),
            older: vec![ring(&["a:1"]), ring(&["b:1", "d:1"])],
            dropped: vec![SavedServer {
                name: "e".into(),
                addr: "e:1".into(),
                weight: 1,
                tls: true,
                zone: None,
            }],
        }
    }

    #[test]
    fn a_written_file_reads_back_the_same_windows() {
        let dir = std::env::temp_dir().join(format!("memring-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state");
        let file = StateFile::new(path.clone(), Arc::new(Stats::new()));
        file.record("default", Some(window()));
        let mut tagged = window();
        tagged.ring.hash_tag = Some("{}".into());
        tagged.ring.ring = "twemproxy".into();
        tagged.ring.hash_without_prefix = Some("myapp:".into());
        // Zones place replicas: a window's rings keep them.
        for (server, zone) in tagged.previous.servers.iter_mut().zip(["x", "y"]) {
            server.zone = Some(zone.into());
        }
        file.record("other pool", Some(tagged.clone()));
        let Loaded::Windows(back) = load(&path) else {
            panic!("{:?}", load(&path))
        };
        assert_eq!(back.get("default"), Some(&window()));
        assert_eq!(back.get("other pool"), Some(&tagged));
        let rebuilt = back["other pool"].previous.build().unwrap();
        assert_eq!(rebuilt.zone_of(1), Some("y"));
        assert_eq!(
            back["other pool"].ring.spec().unwrap().hash_tag,
            Some(*b"{}")
        );
        // A previous ring rebuilt after a restart hashes keys as it did.
        let spec = back["other pool"].ring.spec().unwrap();
        assert_eq!(&*spec.hash_without_prefix, b"myapp:");
        let servers = back["other pool"].ring.server_configs();
        assert_eq!(SavedRing::of(&spec, &servers), tagged.ring);
        assert_eq!(back["default"].ring.spec().unwrap(), Spec::default());
        file.swept("default");
        let Loaded::Windows(back) = load(&path) else {
            panic!()
        };
        assert!(back["default"].swept);
        // The same window again keeps its mark; another one does not.
        file.record("default", Some(window()));
        assert!(matches!(load(&path), Loaded::Windows(w) if w["default"].swept));
        let mut later = window();
        later.until_unix += 1;
        file.record("default", Some(later));
        assert!(matches!(load(&path), Loaded::Windows(w) if !w["default"].swept));
        file.record("default", None);
        file.record("other pool", None);
        assert_eq!(load(&path), Loaded::Windows(BTreeMap::new()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_files_are_refused_with_their_reason() {
        let missing = Path::new("/nonexistent/memring/state");
        assert_eq!(load(missing), Loaded::Missing);
        let refused = |text: &str| match parse(text) {
            Err(reason) => reason,
            Ok(w) => panic!("{text:?} read as {w:?}"),
        };
        assert!(refused("\u{0}\u{1}garbage").starts_with("not a state file"));
        assert_eq!(refused("pools = {}"), "no format version");
        assert!(refused("version = 2").contains("format version 2"));
        let mut text = toml::to_string(&StateText {
            version: 1,
            written_unix: 0,
            pools: [("default".to_string(), window())].into(),
        })
        .unwrap();
        assert!(parse(&text).is_ok());
        text = text.replace("\"memring\"", "\"nosuchring\"");
        assert!(refused(&text).contains("unknown ring flavour"));
        // A device is not a regular file and is not read.
        let Loaded::Unusable(reason) = load(Path::new("/dev/zero")) else {
            panic!()
        };
        assert!(reason.contains("not a regular file"), "{reason}");
        // Over the cap: refused before a byte is read (a sparse file).
        let dir = std::env::temp_dir().join(format!("memring-state-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("state");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_STATE_BYTES + 1)
            .unwrap();
        let Loaded::Unusable(reason) = load(&big) else {
            panic!()
        };
        assert!(reason.contains("larger than the limit"), "{reason}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
