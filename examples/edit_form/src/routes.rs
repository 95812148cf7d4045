//! The axum handlers: the edit page, and the save that is refused when the
//! version in the form is no longer the row's.

use axum::extract::{Form, Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use diesel::prelude::*;
use lockkit::etag::{Problem, VersionIn};
use lockkit::Versioned;

use crate::merge::{merge, Fields, Submitted};
use crate::pages;
use crate::schema::{items, Item, Pool};

/// The routes: `GET /items/{id}/edit`, `POST /items/{id}`.
pub fn app(pool: Pool) -> Router {
    Router::new()
        .route("/items/{id}/edit", get(edit))
        .route("/items/{id}", axum::routing::post(save))
        .with_state(pool)
}

/// Why a request failed, as the page it gets.
#[derive(Debug)]
enum Failure {
    NotFound,
    /// Contention (a busy database, a lock wait) or no connection: try again.
    Unavailable(String),
    /// Refused for a reason trying again does not change, with its status: a
    /// `409` for a version no write can follow (a form whose hidden version was
    /// set to `i32::MAX`), a `500` for a database error.
    Refused(StatusCode, String),
}

impl Failure {
    /// No connection, or a pool that timed out: the page says only that; the
    /// log gets the pool's error.
    fn unavailable(err: &dyn std::fmt::Display) -> Failure {
        eprintln!("edit_form: no connection: {err}");
        Failure::Unavailable("no connection is free".to_owned())
    }
}

/// A lockkit error's page, by lockkit's own HTTP mapping
/// ([`Problem::from_error_in`]) for a version that came in the request's
/// body, as the form's hidden field does: only a `503` (contention, which a
/// retry gets past) says the database is busy. The page shows the problem's
/// detail, which speaks in the client's terms; the error itself, which names
/// the table, the key and the database's words, goes to the log.
impl From<lockkit::Error> for Failure {
    fn from(err: lockkit::Error) -> Failure {
        eprintln!("edit_form: {err}");
        let problem = Problem::from_error_in(&err, VersionIn::Body);
        match problem.status {
            404 => Failure::NotFound,
            503 => Failure::Unavailable(problem.detail),
            status => Failure::Refused(
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                problem.detail,
            ),
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let (status, body) = match self {
            Failure::NotFound => (
                StatusCode::NOT_FOUND,
                pages::message("Not found", "No such item (it may have been deleted)."),
            ),
            Failure::Unavailable(err) => (
                StatusCode::SERVICE_UNAVAILABLE,
                pages::message("Try again", &format!("The database is busy: {err}")),
            ),
            Failure::Refused(status, err) if status.is_client_error() => (
                status,
                pages::message(
                    "Not saved",
                    &format!("This form cannot be saved ({err}). Open the item again to edit it."),
                ),
            ),
            Failure::Refused(status, err) => (
                status,
                pages::message("Something went wrong", &format!("Nothing was saved: {err}")),
            ),
        };
        (status, Html(body)).into_response()
    }
}

/// Runs blocking database work off the async threads.
async fn blocking<T: Send + 'static>(
    pool: Pool,
    work: impl FnOnce(&mut SqliteConnection) -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(move || {
        let mut conn = pool.get().map_err(|err| Failure::unavailable(&err))?;
        work(&mut conn)
    })
    .await
    // The task panicked: a bug, not a busy database.
    .map_err(|err| {
        eprintln!("edit_form: the request's task failed: {err}");
        Failure::Refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request could not be completed".to_owned(),
        )
    })?
}

fn load(conn: &mut SqliteConnection, id: i32) -> Result<Item, Failure> {
    items::table
        .find(id)
        .select(Item::as_select())
        .first(conn)
        .optional()
        .map_err(|err| Failure::from(lockkit::classify(err)))?
        .ok_or(Failure::NotFound)
}

async fn edit(State(pool): State<Pool>, Path(id): Path<i32>, uri: Uri) -> Response {
    let saved = uri.query() == Some("saved=1");
    match blocking(pool, move |conn| load(conn, id)).await {
        Ok(item) => Html(pages::edit(&item, saved)).into_response(),
        Err(failure) => failure.into_response(),
    }
}

/// `UPDATE items SET name = ?, stock = ?, lock_version = lock_version + 1
///  WHERE id = ? AND lock_version = ?`: saved, or a conflict page (409). Any
/// other refusal gets lockkit's status for it (`Failure::from`).
async fn save(
    State(pool): State<Pool>,
    Path(id): Path<i32>,
    Form(form): Form<Submitted>,
) -> Response {
    let result = blocking(pool, move |conn| {
        let mine = form.mine();
        let changes = (
            items::name.eq(mine.name.clone()),
            items::stock.eq(mine.stock),
        );
        match Item::update_by_version(conn, id, form.lock_version, changes) {
            Ok(_) => Ok(None),
            Err(lockkit::Error::Stale(_)) => {
                // Someone saved since this form was rendered: nothing was written.
                let current = load(conn, id)?;
                let now = Fields {
                    name: current.name.clone(),
                    stock: current.stock,
                };
                let merged = merge(&form.original(), &mine, &now);
                Ok(Some(pages::conflict(&mine, &current, &merged)))
            }
            // Not every other error is a busy database: lockkit's mapping says.
            Err(err) => Err(Failure::from(err)),
        }
    })
    .await;
    match result {
        Ok(None) => Redirect::to(&format!("/items/{id}/edit?saved=1")).into_response(),
        Ok(Some(conflict)) => (StatusCode::CONFLICT, Html(conflict)).into_response(),
        Err(failure) => failure.into_response(),
    }
}
