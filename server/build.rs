//! `sqlx::migrate!` embeds the migration files at compile time; this makes a new or changed
//! migration rebuild the crate (stable Rust cannot track the folder from the macro itself).

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
