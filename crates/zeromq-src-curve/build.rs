//! Passes on where libsodium-sys-stable built libsodium, for `Build::build`.
fn main() {
    for var in ["DEP_SODIUM_LIB", "DEP_SODIUM_INCLUDE"] {
        let value = std::env::var(var)
            .unwrap_or_else(|_| panic!("{var} is not set: libsodium-sys-stable did not build"));
        println!("cargo:rustc-env=MILONGA_{var}={value}");
    }
}
