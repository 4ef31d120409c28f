//! An owner's decision on a stored repair: approve (the files written), reject, or roll back.
//! A decision and its file writes commit together; see the module above for the guarantees.

use std::path::Path;

use sqlx::AnyConnection;

use super::{FileChange, RepairError, files_of, read};
use crate::db::{self, DbError, evals as store, evals::{RepairRow, RepairState}};

/// Writes `text` to `path` atomically: a temporary file in the same folder, then a rename.
fn write_atomic(path: &Path, text: &str) -> Result<(), RepairError> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| RepairError::File(format!("cannot write in {}: {e}", dir.display())))?;
    tmp.write_all(text.as_bytes()).and_then(|()| tmp.as_file().sync_all()).map_err(|e| RepairError::File(format!("cannot write {}: {e}", path.display())))?;
    tmp.persist(path).map_err(|e| RepairError::File(format!("cannot replace {}: {}", path.display(), e.error)))?;
    Ok(())
}

/// Who decides, for the row and the git commit.
#[derive(Debug, Clone)]
pub struct Decider {
    pub name: String,
    pub login: String,
}

/// Brings the files of `changes` to their `after` text (`forward`) or back to `before`,
/// refusing when any file is neither where it should start nor already where it should end. A
/// file already at its target is left alone, so an approval or a rollback interrupted after
/// some files were written completes when it is made again.
fn swap(dir: &Path, changes: &[FileChange], forward: bool) -> Result<(), RepairError> {
    let mut pending = Vec::new();
    for c in changes {
        let (from, to) = if forward { (&c.before, &c.after) } else { (&c.after, &c.before) };
        match read(dir, &c.path)? {
            Some(now) if now == *to => {}
            Some(now) if now == *from => pending.push((c, to)),
            _ => return Err(RepairError::Stale(c.path.clone())),
        }
    }
    for (c, to) in pending {
        write_atomic(&dir.join(&c.path), to)?;
    }
    Ok(())
}

/// Approves and applies repair `id`. The state changes and the files are written inside one
/// transaction, committed only once every file is written: whoever is first decides (a second
/// approval waits for the row, then finds it decided), a file that cannot be written leaves the
/// repair proposed, and a crash between the writes and the commit leaves it proposed with its
/// files in place, which approving again completes. The caller reloads the catalog.
pub async fn approve(conn: &mut AnyConnection, dir: &Path, id: i64, by: &Decider, confirm_regressions: bool) -> Result<RepairRow, RepairError> {
    let row = store::get_repair(conn, id).await?.ok_or(RepairError::NotFound(id))?;
    if row.state != RepairState::Proposed {
        return Err(RepairError::Decided { id, state: row.state.to_string() });
    }
    if row.regressions > 0 && !confirm_regressions {
        return Err(RepairError::NeedsConfirmation(id));
    }
    decide_with_files(conn, dir, &row, (RepairState::Proposed, RepairState::Applied), by, &format!("Repair #{id}: {}", row.summary)).await?;
    tracing::info!(repair = id, by = %by.login, "repair applied");
    Ok(store::get_repair(conn, id).await?.unwrap_or(row))
}

/// Rejects repair `id` with a reason; its files are never touched. Refused while a file in
/// `dir` already holds the repair's text (an approval that wrote it and stopped before its
/// commit): rejected, the edit would stay in the file and go live at the next reload.
pub async fn reject(conn: &mut AnyConnection, dir: &Path, id: i64, by: &Decider, reason: &str) -> Result<(), RepairError> {
    if reason.trim().is_empty() {
        return Err(RepairError::ReasonRequired);
    }
    let row = store::get_repair(conn, id).await?.ok_or(RepairError::NotFound(id))?;
    if row.state == RepairState::Proposed {
        for c in files_of(&row).iter().filter(|c| c.before != c.after) {
            if read(dir, &c.path)?.is_some_and(|now| now == c.after) {
                return Err(RepairError::HalfApplied(id));
            }
        }
    }
    if !store::transition(conn, id, RepairState::Proposed, RepairState::Rejected, &by.name, Some(reason.trim()), db::now_ms()).await? {
        return Err(RepairError::Decided { id, state: row.state.to_string() });
    }
    tracing::info!(repair = id, by = %by.login, "repair rejected");
    Ok(())
}

/// Rolls an applied repair back: its files go back to their text before it, if they are still
/// as it left them; like an approval, the state and the files change in one transaction. The
/// caller reloads the catalog.
pub async fn rollback(conn: &mut AnyConnection, dir: &Path, id: i64, by: &Decider) -> Result<(), RepairError> {
    let row = store::get_repair(conn, id).await?.ok_or(RepairError::NotFound(id))?;
    if row.state != RepairState::Applied {
        return Err(RepairError::Decided { id, state: row.state.to_string() });
    }
    decide_with_files(conn, dir, &row, (RepairState::Applied, RepairState::RolledBack), by, &format!("Roll back repair #{id}: {}", row.summary)).await?;
    tracing::info!(repair = id, by = %by.login, "repair rolled back");
    Ok(())
}

/// Moves `row` from one state to the next and its files with it (forward to their text after the
/// repair when it is applied, back otherwise), in one transaction committed only once every file
/// is written; then commits the files to git with `message`. A state changed meanwhile by
/// another decision is `Decided` with that state, and nothing is written.
async fn decide_with_files(conn: &mut AnyConnection, dir: &Path, row: &RepairRow, (from, to): (RepairState, RepairState), by: &Decider, message: &str) -> Result<(), RepairError> {
    let id = row.id;
    let changes = files_of(row);
    let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(DbError::from)?;
    store::lock_repairs(&mut tx).await?;
    if !store::transition(&mut tx, id, from, to, &by.name, None, db::now_ms()).await? {
        drop(tx);
        let state = store::get_repair(conn, id).await?.map(|r| r.state.to_string()).unwrap_or_default();
        return Err(RepairError::Decided { id, state });
    }
    swap(dir, &changes, to == RepairState::Applied)?;
    tx.commit().await.map_err(DbError::from)?;
    commit_if_git(dir, &changes, message, by);
    Ok(())
}

/// Commits the changed files when `dir` is inside a git working tree, with the owner as the
/// author. A folder that is not a working tree (or has no git) is left as it is.
fn commit_if_git(dir: &Path, changes: &[FileChange], message: &str, by: &Decider) {
    let git = |args: &[&str]| std::process::Command::new("git").arg("-C").arg(dir).args(args).output();
    let inside = git(&["rev-parse", "--is-inside-work-tree"]).is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "true");
    if !inside {
        return;
    }
    let paths: Vec<&str> = changes.iter().map(|c| c.path.as_str()).collect();
    let mut add = vec!["add", "--"];
    add.extend(&paths);
    let author = format!("{} <{}@gatehouse.invalid>", by.name, by.login);
    let mut commit = vec!["commit", "-q", "--author", author.as_str(), "-m", message, "--"];
    commit.extend(&paths);
    // The committer is Gatehouse (the server may have no git identity); the author is the owner.
    let mut identified = vec!["-c", "user.name=Gatehouse", "-c", "user.email=gatehouse@gatehouse.invalid"];
    identified.extend(&commit);
    let ok = git(&add).is_ok_and(|o| o.status.success()) && git(&identified).is_ok_and(|o| o.status.success());
    if !ok {
        tracing::warn!(dir = %dir.display(), "the config folder is a git working tree, but committing the repair failed");
    }
}
