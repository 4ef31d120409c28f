//! The simulator's JSON API for owners and tests: `POST /api/simulator/messages` runs a message
//! through the conversation runtime exactly as a WhatsApp message would be, and
//! `GET /api/simulator/chats/{chat_id}` returns a simulated chat. Both sit behind the console
//! guard and check the owner's session themselves too.

use std::sync::Arc;

use app::{backend::SharedBackend, dto::SimulateRequest, error::AppError};
use axum::{
    Json, Router,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use tower_sessions::Session;

use super::{console::ConsoleBackend, state::AppState};

pub fn routes(state: AppState) -> Router {
    Router::new().route("/api/simulator/messages", post(send)).route("/api/simulator/chats/{chat_id}", get(chat)).with_state(state)
}

fn error(e: &AppError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(serde_json::json!({ "code": e.code, "message": e.message }))).into_response()
}

async fn owner(state: &AppState, session: &Session) -> Result<(SharedBackend, i64), Response> {
    let backend: SharedBackend = Arc::new(ConsoleBackend::new(state.clone()));
    match app::auth::owner_of(session, &backend).await {
        Ok(Some(me)) => Ok((backend, me.owner_id)),
        Ok(None) => Err(error(&AppError::unauthorized())),
        Err(e) => Err(error(&e)),
    }
}

async fn send(State(state): State<AppState>, session: Session, Json(request): Json<SimulateRequest>) -> Response {
    let (backend, owner_id) = match owner(&state, &session).await {
        Ok(me) => me,
        Err(denied) => return denied,
    };
    match backend.simulate(owner_id, request).await {
        Ok(outcome) => Json(outcome).into_response(),
        Err(e) => error(&e),
    }
}

async fn chat(State(state): State<AppState>, session: Session, Path(chat_id): Path<String>) -> Response {
    let (backend, _) = match owner(&state, &session).await {
        Ok(me) => me,
        Err(denied) => return denied,
    };
    match backend.chat_detail("simulator", &chat_id).await {
        Ok(detail) => Json(detail).into_response(),
        Err(e) => error(&e),
    }
}
