//! `If-Match` / ETag parsing (`lockkit::etag`) on arbitrary bytes: it never
//! panics, a parsed list written back out parses to the same list, the typed
//! readings agree with each other, and every version's ETag reads back as itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use lockkit::etag::{self, ETag, Expected, IfMatch, IfMatchError};

fn contains<V: PartialEq>(expected: &Result<Expected<V>, IfMatchError>, version: V) -> bool {
    match expected {
        Ok(Expected::Version(v)) => *v == version,
        Ok(Expected::OneOf(versions)) => versions.contains(&version),
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    // Any 8 bytes are a version: its ETag reads back as exactly that version.
    if let Some(bytes) = data.get(..8) {
        let version = i64::from_le_bytes(bytes.try_into().unwrap());
        let header = ETag::from_version(version).to_string();
        assert_eq!(
            etag::expected_version::<i64>(Some(&header)),
            Ok(Expected::Version(version))
        );
    }

    let header = String::from_utf8_lossy(data);
    let parsed = header.parse::<IfMatch>();
    let v16 = etag::expected_version::<i16>(Some(&header));
    let v32 = etag::expected_version::<i32>(Some(&header));
    let v64 = etag::expected_version::<i64>(Some(&header));

    match &parsed {
        Ok(IfMatch::Any) => {
            assert_eq!(header.trim_matches([' ', '\t']), "*");
            assert_eq!(v64, Ok(Expected::Any));
        }
        Ok(IfMatch::Tags(tags)) => {
            assert!(!tags.is_empty());
            let rendered = tags
                .iter()
                .map(|tag| format!("{}\"{}\"", if tag.weak { "W/" } else { "" }, tag.opaque))
                .collect::<Vec<_>>()
                .join(",");
            assert_eq!(rendered.parse::<IfMatch>().as_ref(), parsed.as_ref());
        }
        Err(err) => {
            assert!(matches!(err, IfMatchError::Malformed(_)));
            assert_eq!(v64.as_ref().err(), Some(err));
        }
    }

    // A version that fits the narrower type is read the same by the wider one.
    for version in match &v16 {
        Ok(Expected::Version(v)) => vec![*v],
        Ok(Expected::OneOf(vs)) => vs.clone(),
        _ => vec![],
    } {
        assert!(contains(&v32, i32::from(version)) && contains(&v64, i64::from(version)));
    }
    for version in match &v32 {
        Ok(Expected::Version(v)) => vec![*v],
        Ok(Expected::OneOf(vs)) => vs.clone(),
        _ => vec![],
    } {
        assert!(contains(&v64, i64::from(version)));
    }
});
