//! The routes and their handlers.

use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use lockkit::axum::IfMatchVersion;
use lockkit::etag::ETag;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tower_http::trace::TraceLayer;

use crate::models::{Item, ItemInput};
use crate::{blocking, ApiError, App};

/// The API: `POST /items`, `GET`/`PUT`/`DELETE /items/{id}`, `POST
/// /items/{id}/sell` and `/restock`, and `PUT /blocking/items/{id}`.
///
/// Every request is traced (`tower_http::trace::TraceLayer`: method, path,
/// status and latency as `tracing` spans and events). The state is the pools:
/// handlers take `State<App>` and await their statements on a diesel-async
/// connection from it; `PUT /blocking/items/{id}` runs blocking Diesel on a
/// blocking thread instead (see `blocking.rs`).
pub fn router(app: App) -> Router {
    Router::new()
        .route("/items", post(create_item))
        .route(
            "/items/{id}",
            get(get_item).put(update_item).delete(delete_item),
        )
        .route("/items/{id}/sell", post(sell_item))
        .route("/items/{id}/restock", post(restock_item))
        .route("/blocking/items/{id}", put(blocking::update_item))
        .layer(TraceLayer::new_for_http())
        .with_state(app)
}

/// The item's id from the path; a bad one is a problem+json `400`. The
/// handlers that also take `If-Match` take it first: axum runs the extractors
/// in order, and a request without it is a `428` whatever its path.
pub(crate) struct ItemId(pub(crate) i32);

impl<S: Send + Sync> FromRequestParts<S> for ItemId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let path = Path::from_request_parts(parts, state).await;
        let Path(id) = path.map_err(|e| ApiError::Rejected {
            status: e.status(),
            detail: e.body_text(),
        })?;
        Ok(ItemId(id))
    }
}

/// A request body that can be refused after it parsed.
pub(crate) trait Validate {
    /// Why the body is not acceptable (a problem+json `422`), if it is not.
    fn validate(&self) -> Result<(), String>;
}

impl Validate for ItemInput {
    fn validate(&self) -> Result<(), String> {
        ItemInput::validate(self)
    }
}

/// The JSON body, validated; a bad one is a problem+json `400`/`415`/`422`.
pub(crate) struct Valid<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned + Validate> FromRequest<S> for Valid<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let json = Json::<T>::from_request(request, state).await;
        let Json(body) = json.map_err(|e| ApiError::Rejected {
            status: e.status(),
            detail: e.body_text(),
        })?;
        body.validate().map_err(ApiError::Invalid)?;
        Ok(Valid(body))
    }
}

/// The item with its `ETag`.
pub(crate) fn tagged(item: Item) -> (ETag, Json<Item>) {
    (ETag::from_version(item.lock_version), Json(item))
}

/// `GET /items/{id}`: `200` with the item and its `ETag`, or `404`.
async fn get_item(
    State(app): State<App>,
    ItemId(id): ItemId,
) -> Result<impl IntoResponse, ApiError> {
    let item = app.db.get(id).await?;
    Ok(tagged(item))
}

/// `POST /items`: `201` with `Location`, `ETag` and the item.
async fn create_item(
    State(app): State<App>,
    Valid(input): Valid<ItemInput>,
) -> Result<impl IntoResponse, ApiError> {
    let item = app.db.create(&input).await?;
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
    if_match: IfMatchVersion<i32>,
    ItemId(id): ItemId,
    Valid(input): Valid<ItemInput>,
) -> Result<impl IntoResponse, ApiError> {
    let item = app.db.update(id, if_match.expected(), &input).await?;
    Ok(tagged(item))
}

/// `DELETE /items/{id}` with `If-Match`: `204`; `412`, `428`, `400`, `404` as for
/// `PUT`.
async fn delete_item(
    State(app): State<App>,
    if_match: IfMatchVersion<i32>,
    ItemId(id): ItemId,
) -> Result<StatusCode, ApiError> {
    app.db.delete(id, if_match.expected()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The body of `POST /items/{id}/sell` and `/restock`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Quantity {
    /// How many units, at least 1.
    quantity: i32,
}

/// Not at least 1 is a problem+json `422`.
impl Validate for Quantity {
    fn validate(&self) -> Result<(), String> {
        if self.quantity < 1 {
            return Err(format!(
                "`quantity` must be at least 1 (got {})",
                self.quantity
            ));
        }
        Ok(())
    }
}

/// `POST /items/{id}/sell` `{"quantity": n}`: takes `n` from the stock under the
/// row's lock, no `If-Match` needed. `200` with the item and its new `ETag`;
/// `409` when fewer are in stock; `503` when the row stayed locked longer than
/// the lock timeout; `404`.
async fn sell_item(
    State(app): State<App>,
    ItemId(id): ItemId,
    Valid(Quantity { quantity }): Valid<Quantity>,
) -> Result<impl IntoResponse, ApiError> {
    let item = app
        .db
        .sell(id, quantity, app.lock_options(), app.sale_delay)
        .await?;
    Ok(tagged(item))
}

/// `POST /items/{id}/restock` `{"quantity": n}`: adds `n` to the stock with an
/// optimistic write, retried on conflict. `200` with the item and its new
/// `ETag`; `503` when every attempt met a conflict (nothing written); `404`.
async fn restock_item(
    State(app): State<App>,
    ItemId(id): ItemId,
    Valid(Quantity { quantity }): Valid<Quantity>,
) -> Result<impl IntoResponse, ApiError> {
    let item = app.db.restock(id, quantity, &app.retry).await?;
    Ok(tagged(item))
}
