//! An owner's decision on a stored repair: approve (the files written), reject, or roll back.
//! A decision and its file writes commit together; see the module above for the guarantees.

use std::path::Path;

use sqlx::AnyConnection;

use super::{FileChange, RepairError, TableRow, Workspace, files_of, read, run_all, table, table_of};
use crate::db::{
    self, DbError,
    audit::{self, event},
    evals as store,
    evals::{RepairRow, RepairState},
};

/// Writes `text` to `path` atomically: a temporary file in the same folder, then a rename,
/// then the folder synced so the rename survives a power cut. The file keeps its permissions
/// and, where the process may set them, its owner (a temporary file is made 0600, which a
/// server running as another user could no longer read). A symbolic link is followed: the file
/// it names is replaced and the link stays.
fn write_atomic(path: &Path, text: &str) -> Result<(), RepairError> {
    use std::io::Write;
    let target = match std::fs::canonicalize(path) {
        Ok(target) => target,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => path.to_path_buf(),
        Err(e) => return Err(RepairError::File(format!("cannot read {}: {e}", path.display()))),
    };
    let dir = target.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| RepairError::File(format!("cannot write in {}: {e}", dir.display())))?;
    if let Ok(meta) = std::fs::metadata(&target) {
        use std::os::unix::fs::MetadataExt;
        tmp.as_file().set_permissions(meta.permissions()).map_err(|e| RepairError::File(format!("cannot set the permissions of {}: {e}", path.display())))?;
        // Only root may give a file away; anyone else keeps their own, as the editor would.
        let _ = std::os::unix::fs::fchown(tmp.as_file(), Some(meta.uid()), Some(meta.gid()));
    }
    tmp.write_all(text.as_bytes()).and_then(|()| tmp.as_file().sync_all()).map_err(|e| RepairError::File(format!("cannot write {}: {e}", path.display())))?;
    tmp.persist(&target).map_err(|e| RepairError::File(format!("cannot replace {}: {}", path.display(), e.error)))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| RepairError::File(format!("cannot sync {}: {e}", dir.display())))?;
    Ok(())
}

/// Who decides, for the row, the owner audit and the git commit.
#[derive(Debug, Clone, Default)]
pub struct Decider {
    pub name: String,
    pub login: String,
    /// The owner account (none from the command line).
    pub owner_id: Option<i64>,
    /// Where the decision came from (the console's client address).
    pub ip: Option<String>,
}

impl Decider {
    /// The decision's owner-audit row, written in the decision's own transaction: a decision
    /// is never on record without it, nor it without the decision.
    async fn audit(&self, conn: &mut AnyConnection, event: &str, id: i64, confirm_regressions: Option<bool>) -> Result<(), DbError> {
        let detail = serde_json::json!({ "repair": id, "login": self.login, "confirm_regressions": confirm_regressions });
        let entry = audit::AuditEntry { owner_id: self.owner_id, login: Some(&self.login), ip: self.ip.as_deref(), event, detail: Some(detail) };
        audit::record(conn, entry).await
    }
}

/// Brings the files of `changes` to their `after` text (`forward`) or back to `before`,
/// refusing when any file is neither where it should start nor already where it should end. A
/// file already at its target is left alone, so an approval or a rollback interrupted after
/// some files were written completes when it is made again.
fn swap(dir: &Path, changes: &[FileChange], forward: bool) -> Result<(), RepairError> {
    for (c, to) in still_swappable(dir, changes, forward)? {
        write_atomic(&dir.join(&c.path), to)?;
    }
    Ok(())
}

/// The files of `changes` still to write, with their text, for [`swap`]; `REPAIR_STALE` when
/// any is neither where it should start nor already where it should end.
fn still_swappable<'a>(dir: &Path, changes: &'a [FileChange], forward: bool) -> Result<Vec<(&'a FileChange, &'a String)>, RepairError> {
    let mut pending = Vec::new();
    for c in changes {
        let (from, to) = if forward { (&c.before, &c.after) } else { (&c.after, &c.before) };
        match read(dir, &c.path)? {
            Some(now) if now == *to => {}
            Some(now) if now == *from => pending.push((c, to)),
            _ => return Err(RepairError::Stale(c.path.clone())),
        }
    }
    Ok(pending)
}

/// Approves and applies repair `id`. Every case is replayed first over the files and cases as
/// they are now, since the table the owner saw may be older than a case added or a tool file
/// edited since: a repair that now breaks a case its table did not say it breaks is refused
/// (`REPAIR_REPLAY_CHANGED`) with its table brought up to date (the same number of broken
/// cases, others among them, is a change too), and one that breaks any needs
/// `confirm_regressions`. The state changes and the files are written inside one transaction,
/// committed only once every file is written: whoever is first decides (a second approval
/// waits for the row, then finds it decided), a file that cannot be written leaves the repair
/// proposed, and a crash between the writes and the commit leaves it proposed with its files in
/// place, which approving again completes. The caller reloads the catalog.
///
/// `seen` is the [`fingerprint`] of the diff and table the owner was shown, when they were
/// shown them: a proposal a cycle brought up to date since, or whose table another approval's
/// replay changed, is refused (`REPAIR_CHANGED`), never applied unseen.
pub async fn approve(conn: &mut AnyConnection, ws: &Workspace, id: i64, by: &Decider, confirm_regressions: bool, seen: Option<&str>) -> Result<RepairRow, RepairError> {
    let row = store::get_repair(conn, id).await?.ok_or(RepairError::NotFound(id))?;
    if row.state != RepairState::Proposed {
        return Err(RepairError::Decided { id, state: row.state.to_string() });
    }
    if seen.is_some_and(|seen| seen != fingerprint(&row)) {
        return Err(RepairError::Changed(id));
    }
    // A file edited since the proposal is refused before the replay: replayed, the proposal's
    // text over the newer file would count the undoing of that edit as the repair's regressions.
    still_swappable(&ws.config_dir, &files_of(&row), true)?;
    let shown: std::collections::BTreeSet<String> = table_of(&row).into_iter().filter(TableRow::regressed).map(|t| t.case).collect();
    let fresh = replay_again(conn, ws, &row).await?;
    let regressions = fresh.iter().filter(|t| t.regressed()).count() as i64;
    if fresh.iter().any(|t| t.regressed() && !shown.contains(&t.case)) {
        return Err(RepairError::ReplayChanged { id, regressions });
    }
    if regressions > 0 && !confirm_regressions {
        return Err(RepairError::NeedsConfirmation(id));
    }
    let audit = (event::REPAIR_APPROVED, Some(confirm_regressions));
    decide_with_files(conn, &ws.config_dir, &row, (RepairState::Proposed, RepairState::Applied), by, audit, &format!("Repair #{id}: {}", row.summary)).await?;
    tracing::info!(repair = id, by = %by.login, "repair applied");
    Ok(store::get_repair(conn, id).await?.unwrap_or(row))
}

/// What an approval names the repair it was shown by: the SHA-256, in hex, of its diff and its
/// before/after table (which cases it fixes and breaks).
pub fn fingerprint(row: &RepairRow) -> String {
    db::sha256_hex(&format!("{}\n{}", row.diff, row.results))
}

/// Replays every stored case before and after `row`'s change, over the config folder as it is
/// now, stores the table when it differs from the one on the row, and returns it.
async fn replay_again(conn: &mut AnyConnection, ws: &Workspace, row: &RepairRow) -> Result<Vec<TableRow>, RepairError> {
    let cases = crate::evals::findings::cases(conn).await?;
    let Some(change) = files_of(row).into_iter().find(|c| c.before != c.after) else { return Ok(Vec::new()) };
    let before = run_all(&ws.judge()?, &cases).await;
    let after = run_all(&ws.judge_with(&change)?, &cases).await;
    let fresh = table(&before, &after);
    let regressions = fresh.iter().filter(|r| r.regressed()).count() as i64;
    if fresh != table_of(row) {
        let fixes = fresh.iter().filter(|r| r.fixed()).count() as i64;
        store::set_results(conn, row, &serde_json::to_string(&fresh).unwrap_or_default(), fixes, regressions).await?;
    }
    Ok(fresh)
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
    let mut tx = db::begin_write_on(conn).await?;
    if !store::transition(&mut tx, id, RepairState::Proposed, RepairState::Rejected, &by.name, Some(reason.trim()), db::now_ms()).await? {
        return Err(RepairError::Decided { id, state: row.state.to_string() });
    }
    by.audit(&mut tx, event::REPAIR_REJECTED, id, None).await?;
    tx.commit().await.map_err(DbError::from)?;
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
    decide_with_files(conn, dir, &row, (RepairState::Applied, RepairState::RolledBack), by, (event::REPAIR_ROLLED_BACK, None), &format!("Roll back repair #{id}: {}", row.summary)).await?;
    tracing::info!(repair = id, by = %by.login, "repair rolled back");
    Ok(())
}

/// Moves `row` from one state to the next and its files with it (forward to their text after the
/// repair when it is applied, back otherwise), in one transaction committed only once every file
/// is written; then commits the files to git with `message`. A state changed meanwhile by
/// another decision is `Decided` with that state, and nothing is written.
async fn decide_with_files(
    conn: &mut AnyConnection,
    dir: &Path,
    row: &RepairRow,
    (from, to): (RepairState, RepairState),
    by: &Decider,
    (audit_event, confirm_regressions): (&str, Option<bool>),
    message: &str,
) -> Result<(), RepairError> {
    let id = row.id;
    let changes = files_of(row);
    let mut tx = db::begin_write_on(conn).await?;
    store::lock_repairs(&mut tx).await?;
    // Decided meanwhile, or brought up to date by a cycle since `row` was read and checked (the
    // replay takes a while): what is written is what was checked, or nothing.
    match store::get_repair(&mut tx, id).await? {
        Some(now) if now.state != from => return Err(RepairError::Decided { id, state: now.state.to_string() }),
        Some(now) if now.files != row.files => return Err(RepairError::Changed(id)),
        _ => {}
    }
    if !store::transition(&mut tx, id, from, to, &by.name, None, db::now_ms()).await? {
        drop(tx);
        let state = store::get_repair(conn, id).await?.map(|r| r.state.to_string()).unwrap_or_default();
        return Err(RepairError::Decided { id, state });
    }
    by.audit(&mut tx, audit_event, id, confirm_regressions).await?;
    swap(dir, &changes, to == RepairState::Applied)?;
    tx.commit().await.map_err(DbError::from)?;
    commit_if_git(dir, &changes, to == RepairState::Applied, message, by).await;
    Ok(())
}

/// How long one git command of a repair's commit may take.
const GIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Commits the changed files when `dir` is inside a git working tree, with the owner as the
/// author. A folder that is not a working tree (or has no git) is left as it is. The commit is
/// the server's own: unsigned and without the repository's hooks (a signing key's passphrase
/// prompt or a hook would hold the owner's request), and each command is given up after
/// [`GIT_TIMEOUT`]; the decision stands either way, and a failed commit is logged.
///
/// Only a file whose text before the change (`before`, or `after` for a rollback: `forward`
/// false) is the one committed at `HEAD` is committed: otherwise it held edits nobody committed,
/// which would go in under the owner's name. Then the change stays uncommitted, and is logged.
async fn commit_if_git(dir: &Path, changes: &[FileChange], forward: bool, message: &str, by: &Decider) {
    let git = async |args: &[&str]| {
        let mut command = tokio::process::Command::new("git");
        command.arg("-C").arg(dir).args(["-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null"]).args(args).stdin(std::process::Stdio::null()).kill_on_drop(true);
        // No terminal prompt for credentials or a passphrase, ever.
        command.env("GIT_TERMINAL_PROMPT", "0");
        match tokio::time::timeout(GIT_TIMEOUT, command.output()).await {
            Ok(output) => output.ok(),
            Err(_) => {
                tracing::warn!(dir = %dir.display(), command = args.first().copied().unwrap_or_default(), "a git command of a repair's commit took too long; given up");
                None
            }
        }
    };
    let inside = git(&["rev-parse", "--is-inside-work-tree"]).await.is_some_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "true");
    if !inside {
        return;
    }
    for c in changes.iter().filter(|c| c.before != c.after) {
        let was = if forward { &c.before } else { &c.after };
        let committed = git(&["show", &format!("HEAD:./{}", c.path)]).await.filter(|o| o.status.success()).map(|o| o.stdout);
        if committed.as_deref() != Some(was.as_bytes()) {
            tracing::warn!(dir = %dir.display(), file = %c.path, "the file held changes not committed to git; the repair's change is left uncommitted, so that they are not committed under the owner's name");
            return;
        }
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
    let ok = git(&add).await.is_some_and(|o| o.status.success()) && git(&identified).await.is_some_and(|o| o.status.success());
    if !ok {
        tracing::warn!(dir = %dir.display(), "the config folder is a git working tree, but committing the repair failed");
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// The repair's change is committed with the owner as its author only when the file was,
    /// before it, as committed: a colleague's uncommitted edit is not committed under their name.
    #[tokio::test]
    async fn only_a_file_as_committed_is_committed_under_the_owners_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let git = |args: &[&str]| std::process::Command::new("git").arg("-C").arg(dir.path()).args(args).output().expect("git");
        let log = || String::from_utf8_lossy(&git(&["log", "--format=%an|%s"]).stdout).into_owned();
        git(&["init", "-q"]);
        std::fs::write(dir.path().join("tools.toml"), "a = 1\n").expect("write");
        git(&["add", "."]);
        git(&["-c", "user.name=Setup", "-c", "user.email=setup@example.invalid", "commit", "-qm", "shipped"]);
        let by = Decider { name: "Ada".into(), login: "ada".into(), ..Decider::default() };
        // Edited by hand and not committed, then a repair on top of that text.
        std::fs::write(dir.path().join("tools.toml"), "a = 2\n").expect("hand edit");
        let change = FileChange { path: "tools.toml".into(), before: "a = 2\n".into(), after: "a = 2\nb = 3\n".into() };
        std::fs::write(dir.path().join("tools.toml"), &change.after).expect("repair");
        commit_if_git(dir.path(), std::slice::from_ref(&change), true, "Repair #1", &by).await;
        assert_eq!(log(), "Setup|shipped\n", "nothing committed over the hand edit");
        // From a file as committed, the change is committed with the owner as its author.
        git(&["-c", "user.name=Setup", "-c", "user.email=setup@example.invalid", "commit", "-qam", "the hand edit, committed"]);
        std::fs::write(dir.path().join("tools.toml"), "a = 2\nb = 3\nc = 4\n").expect("repair");
        let change = FileChange { path: "tools.toml".into(), before: "a = 2\nb = 3\n".into(), after: "a = 2\nb = 3\nc = 4\n".into() };
        commit_if_git(dir.path(), std::slice::from_ref(&change), true, "Repair #2", &by).await;
        assert!(log().starts_with("Ada|Repair #2\n"), "{}", log());
    }

    #[test]
    fn a_rewritten_file_keeps_its_permissions_and_its_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tools.toml");
        std::fs::write(&file, "old").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write_atomic(&file, "new").expect("written");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "new");
        assert_eq!(std::fs::metadata(&file).expect("meta").permissions().mode() & 0o777, 0o644, "not the temporary file's 0600");

        let real = dir.path().join("kept").join("tools.toml");
        std::fs::create_dir(real.parent().expect("parent")).expect("mkdir");
        std::fs::write(&real, "old").expect("write");
        let link = dir.path().join("linked.toml");
        std::os::unix::fs::symlink(&real, &link).expect("link");
        write_atomic(&link, "new").expect("written");
        assert!(std::fs::symlink_metadata(&link).expect("meta").file_type().is_symlink(), "the link stays a link");
        assert_eq!(std::fs::read_to_string(&real).expect("read"), "new", "the file it names is written");
    }
}
