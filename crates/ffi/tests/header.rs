//! include/plusfs.h must be what cbindgen makes of this crate today.
//! `PLUSFS_BLESS=1 cargo test -p plusfs-ffi --test header` rewrites it.

#[test]
fn committed_header_is_current() {
    let crate_dir = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(format!("{crate_dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen runs")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("utf-8");
    let path = format!("{crate_dir}/../../include/plusfs.h");
    if std::env::var_os("PLUSFS_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/plusfs.h is stale: run PLUSFS_BLESS=1 cargo test -p plusfs-ffi --test header"
    );
}
