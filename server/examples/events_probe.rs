//! A second process for the live-events tests: it follows a database's events and prints each
//! as one JSON line, and on request writes something others should see.
//!
//! Usage: events_probe DATABASE_URL
//! Prints `ready` once subscribed, then every event. Reads commands from stdin, one a line:
//! `enqueue CHAT` queues a `probe.noop` job for chat CHAT (its state change is an event), and
//! `receipt WAMID` publishes a WhatsApp read receipt for WAMID (an event without a row).
//! It never reads on a timer (`events.poll_interval` is an hour), so only PostgreSQL's NOTIFY
//! tells it about other processes' writes.

use std::{io::Write, time::Duration};

use server::{
    config::{DatabaseSettings, EventSettings},
    db::{Db, jobs::NewJob},
    events::{Delivery, Envelope, Event, Events},
    jobs::JobQueue,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args().nth(1).ok_or_else(|| anyhow::anyhow!("usage: events_probe DATABASE_URL"))?;
    let db = Db::connect(&DatabaseSettings { url, ..Default::default() }).await?;
    let settings = EventSettings { poll_interval: Duration::from_secs(3600), ..Default::default() };
    let events = Events::new(db.clone(), &settings);
    let queue = JobQueue::new(db);
    let mut sub = events.subscribe().await;
    println!("ready");
    std::io::stdout().flush()?;
    let publisher = events.clone();
    let (tx, mut commands) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(line) = commands.recv().await {
            match line.split_once(' ') {
                Some(("enqueue", chat)) => {
                    let job = NewJob { kind: "probe.noop".into(), chat_id: Some(chat.into()), correlation_id: "probe".into(), ..Default::default() };
                    queue.enqueue(&job).await.expect("enqueue");
                }
                Some(("receipt", wamid)) => {
                    let event = Event::ReplyRead(Delivery { wamid: Some(wamid.into()), reason_code: "READ".into(), ..Delivery::default() });
                    publisher.publish_fact(Envelope { id: None, channel: Some("whatsapp".into()), chat_id: None, event }).await;
                }
                _ => eprintln!("unknown command {line:?}"),
            }
        }
    });
    while let Some(envelope) = sub.recv().await {
        println!("{}", serde_json::to_string(&*envelope)?);
        std::io::stdout().flush()?;
    }
    Ok(())
}
