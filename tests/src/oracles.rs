//! Rules lockkit documents, written from its documentation rather than from its
//! code, for the property tests (`tests/hostile_input.rs`) and the fuzz targets
//! (`fuzz/`, which include this file by path: keep it free of dependencies).

/// The names `version_trigger` accepts, as it documents them:
/// `[A-Za-z_][A-Za-z0-9_]*`, at most 40 characters.
pub fn plain_identifier(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 40
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
}
