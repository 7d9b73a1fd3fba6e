//! The Lua scripts, each one atomic step in Redis.

use std::sync::LazyLock;

use ::redis::Script;

pub(super) static APPEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("append.lua")));
pub(super) static PUBLISH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("publish.lua")));
pub(super) static CREATE_ROOM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("create_room.lua")));
pub(super) static DELETE_ROOM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("delete_room.lua")));
pub(super) static SET_ROOM_MEMBERS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("set_room_members.lua")));
pub(super) static STORE_SNAPSHOT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("store_snapshot.lua")));
pub(super) static WEBHOOK_ENQUEUE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("webhook_enqueue.lua")));
pub(super) static WEBHOOK_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("webhook_lease.lua")));
pub(super) static REDEEM_TICKET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("redeem_ticket.lua")));
pub(super) static WEBHOOK_ENQUEUE_TARGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("webhook_enqueue_target.lua")));
pub(super) static WEBHOOK_MARK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("webhook_mark.lua")));

/// Every script, loaded on each connection to a Redis Cluster's servers.
pub(super) fn all() -> Vec<&'static Script> {
    vec![
        &*APPEND,
        &*PUBLISH,
        &*CREATE_ROOM,
        &*DELETE_ROOM,
        &*SET_ROOM_MEMBERS,
        &*STORE_SNAPSHOT,
        &*WEBHOOK_ENQUEUE,
        &*WEBHOOK_LEASE,
        &*REDEEM_TICKET,
        &*WEBHOOK_ENQUEUE_TARGET,
        &*WEBHOOK_MARK,
    ]
}
