//! `read_result`: reads back, page by page, a tool result too large to pass inline (stored by
//! the checkpoint under a `result_ref`). Bound to the chat whose call made the result: the
//! tool's `chat_id` must be a managed field, so the runtime fills it and a model cannot name
//! another chat's result.

use serde_json::{Value, json};

use crate::{
    db::{self, Db},
    tools::{ToolDef, ToolError, ToolExecutor},
};

pub const HANDLER: &str = "read_result";

/// Characters of a stored result per page.
pub const PAGE_CHARS: usize = 4000;

pub struct ReadResult {
    db: Db,
}

impl ReadResult {
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[async_trait::async_trait]
impl ToolExecutor for ReadResult {
    async fn call(&self, tool: &ToolDef, args: &Value) -> Result<Value, ToolError> {
        if !tool.spec.managed_fields.iter().any(|f| f == "chat_id") {
            return Err(ToolError::refused("RESULT_NOT_BOUND", format!("{} must declare chat_id as a managed field", tool.spec.name)));
        }
        let id = args.get("result_ref").and_then(Value::as_str).unwrap_or_default();
        let page = args.get("page").and_then(Value::as_u64).unwrap_or(1).max(1);
        let not_found = || ToolError::refused("RESULT_NOT_FOUND", format!("there is no stored result {id:?} for this chat (it may have expired)"));
        let Some(chat_id) = args.get("chat_id").and_then(Value::as_str).filter(|c| !c.is_empty()) else { return Err(not_found()) };
        let mut conn = self.db.pool.acquire().await.map_err(|e| ToolError::new("DATABASE_ERROR", e.to_string(), true))?;
        let body = db::tool_results::get_for_chat(&mut conn, id, chat_id).await.map_err(|e| ToolError::new("DATABASE_ERROR", e.to_string(), true))?.ok_or_else(not_found)?;
        let chars: Vec<char> = body.chars().collect();
        let pages = chars.len().div_ceil(PAGE_CHARS).max(1);
        let index = usize::try_from(page).unwrap_or(usize::MAX);
        if index > pages {
            return Err(ToolError::refused("RESULT_PAGE_OUT_OF_RANGE", format!("result {id} has {pages} page(s)")));
        }
        let text: String = chars.iter().skip((index - 1) * PAGE_CHARS).take(PAGE_CHARS).collect();
        Ok(json!({ "result_ref": id, "page": index, "pages": pages, "text": text }))
    }
}
