//! axum glue for [`etag`](crate::etag) (feature `axum`).
