//! The routes and their handlers.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use lockkit::axum::IfMatchVersion;
use lockkit::etag::ETag;
use tower_http::trace::TraceLayer;

use crate::models::{Item, ItemInput};
use crate::{ApiError, App};

/// The API: `POST /items`, `GET`/`PUT`/`DELETE /items/{id}`.
///
/// Every request is traced (`tower_http::trace::TraceLayer`: method, path,
/// status and latency as `tracing` spans and events). The state is the pool:
/// handlers take `State<App>` and run their database work on a blocking thread
/// with a connection from it (`App::blocking`).
pub fn router(app: App) -> Router {
    Router::new()
        .route("/items", post(create_item))
        .route(
            "/items/{id}",
            get(get_item).put(update_item).delete(delete_item),
        )
        .layer(TraceLayer::new_for_http())
        .with_state(app)
}

/// The item's id from the path; a bad one is a problem+json `400`.
fn item_id(path: Result<Path<i32>, PathRejection>) -> Result<i32, ApiError> {
    path.map(|Path(id)| id).map_err(|e| ApiError::Rejected {
        status: e.status(),
        detail: e.body_text(),
    })
}

/// The JSON body, validated; a bad one is a problem+json `400`/`415`/`422`.
fn item_input(body: Result<Json<ItemInput>, JsonRejection>) -> Result<ItemInput, ApiError> {
    let Json(input) = body.map_err(|e| ApiError::Rejected {
        status: e.status(),
        detail: e.body_text(),
    })?;
    input.validate().map_err(ApiError::Invalid)?;
    Ok(input)
}

/// The item with its `ETag`.
fn tagged(item: Item) -> (ETag, Json<Item>) {
    (ETag::from_version(item.lock_version), Json(item))
}

/// `GET /items/{id}`: `200` with the item and its `ETag`, or `404`.
async fn get_item(
    State(app): State<App>,
    path: Result<Path<i32>, PathRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let id = item_id(path)?;
    let item = app.blocking(move |store| store.get(id)).await?;
    Ok(tagged(item))
}

/// `POST /items`: `201` with `Location`, `ETag` and the item.
async fn create_item(
    State(app): State<App>,
    body: Result<Json<ItemInput>, JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let input = item_input(body)?;
    let item = app.blocking(move |store| store.create(&input)).await?;
    let location = HeaderValue::try_from(format!("/items/{}", item.id))
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        tagged(item),
    ))
}

/// `PUT /items/{id}` with `If-Match`: `200` with the item as written and its new
/// `ETag`; `412` with the current `ETag` when the item changed since the client's
/// tag; `428` without `If-Match`, `400` for a malformed one, `404`.
async fn update_item(
    State(app): State<App>,
    path: Result<Path<i32>, PathRejection>,
    if_match: IfMatchVersion<i32>,
    body: Result<Json<ItemInput>, JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let id = item_id(path)?;
    let input = item_input(body)?;
    let item = app
        .blocking(move |store| store.update(id, &if_match, &input))
        .await?;
    Ok(tagged(item))
}

/// `DELETE /items/{id}` with `If-Match`: `204`; `412`, `428`, `400`, `404` as for
/// `PUT`.
async fn delete_item(
    State(app): State<App>,
    path: Result<Path<i32>, PathRejection>,
    if_match: IfMatchVersion<i32>,
) -> Result<StatusCode, ApiError> {
    let id = item_id(path)?;
    app.blocking(move |store| store.delete(id, &if_match))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
