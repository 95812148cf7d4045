//! Bound ETags (`lockkit::etag::ETagSecret`) on arbitrary bytes: checking a
//! header never panics and never matches by chance, and every resource's tag at
//! every version fits that resource and version only.

#![no_main]

use libfuzzer_sys::fuzz_target;
use lockkit::etag::{ETagSecret, Expected, IfMatch, IfMatchError, MIN_SECRET_LEN};

fuzz_target!(|data: &[u8]| {
    let secret = ETagSecret::new(&[42; MIN_SECRET_LEN]).unwrap();
    let version = data
        .get(..8)
        .map_or(0, |bytes| i64::from_le_bytes(bytes.try_into().unwrap()));
    let key = String::from_utf8_lossy(data.get(8..).unwrap_or_default());
    let tags = secret.resource("items", &key);

    // The input as a header: never a panic; never a match unless it is `*`.
    let header = String::from_utf8_lossy(data);
    if let Ok(parsed) = header.parse::<IfMatch>() {
        if parsed != IfMatch::Any {
            assert_eq!(tags.expected(&parsed, version), Err(IfMatchError::NoMatch));
        }
    }

    // The input as a resource and version: its tag reads back there only.
    let tag: IfMatch = tags.etag(version).to_string().parse().unwrap();
    assert_eq!(tags.expected(&tag, version), Ok(Expected::Version(version)));
    assert!(tags.expected(&tag, version.wrapping_add(1)).is_err());
    assert!(secret
        .resource("items", format!("{key}."))
        .expected(&tag, version)
        .is_err());
});
