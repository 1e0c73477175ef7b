//! The `zeromq-src` 0.2 API that `zmq-sys` 0.12 calls, building libzmq with
//! CURVE whatever the caller asks: libzmq from `zeromq-src` 0.3 (4.3.5,
//! with the fixes listed in `crates/zeromq-src-patched/PATCHES.md`),
//! linked against the libsodium that `libsodium-sys-stable` built from its
//! bundled, signature-checked sources. `with_libsodium(None)` (what zmq-sys
//! passes) would build libzmq without CURVE; Milonga's security needs it.
//!
//! It also builds libzmq's draft API, for two socket options that 4.3.5
//! offers only there: `ZMQ_OUT_BATCH_SIZE` and `ZMQ_IN_BATCH_SIZE`, how
//! many bytes a connection hands the kernel per `send` and reads per
//! `recv` (docs/internals.md, §4 "Batch sizes"). Nothing else of the
//! draft API is used, and building it changes none of libzmq's defaults.

pub use upstream::LibLocation;

/// Builds libzmq; see the crate documentation.
#[derive(Debug)]
pub struct Build {
    inner: upstream::Build,
}

impl Default for Build {
    fn default() -> Self {
        Self::new()
    }
}

impl Build {
    /// A libzmq build with CURVE on.
    pub fn new() -> Self {
        let mut build = Self {
            inner: upstream::Build::new(),
        };
        build.with_libsodium(None);
        build
    }

    /// Whether to build libzmq with debug symbols.
    pub fn build_debug(&mut self, enabled: bool) -> &mut Self {
        self.inner.build_debug(enabled);
        self
    }

    /// Kept for the 0.2 API; the draft API is always built (see the crate
    /// documentation).
    pub fn enable_draft(&mut self, _enabled: bool) -> &mut Self {
        self
    }

    /// Where libsodium is; `None` means the one built for this shim (never
    /// the tweetnacl build of libzmq, which its authors call unaudited).
    pub fn with_libsodium(&mut self, location: Option<LibLocation>) -> &mut Self {
        let location = location.unwrap_or_else(|| {
            LibLocation::new(
                env!("MILONGA_DEP_SODIUM_LIB"),
                env!("MILONGA_DEP_SODIUM_INCLUDE"),
            )
        });
        self.inner.with_libsodium(Some(location));
        self
    }

    /// Builds libzmq and prints the link lines for the calling build script.
    pub fn build(&mut self) {
        self.inner.enable_draft(true);
        self.inner.build();
    }
}
