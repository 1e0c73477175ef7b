//! Keys and trust for a node whose `security` is on (docs/security.md):
//! an [`Identity`] (a name and a CURVE key pair, `NAME.key`), the
//! [`PublicKey`] others know it by (`NAME.pub`), and a [`Trust`]
//! directory of the public keys allowed to connect.
//!
//! ```no_run
//! use milonga::security::Identity;
//!
//! let me = Identity::generate("ps-server")?;
//! let (secret, public) = me.write(std::path::Path::new("keys"))?;
//! println!("{} is {}", secret.display(), me.public());
//! # let _ = public;
//! # Ok::<(), milonga::SecurityError>(())
//! ```

pub use crate::backend::p2p::curve::{
    load_public, valid_name, Identity, PublicKey, Trust, KEY_BYTES, MAX_TRUSTED, Z85_KEY_CHARS,
};
