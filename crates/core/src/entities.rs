use std::collections::BTreeMap;

use plaza_protocol::server::EntityInfo;
use plaza_protocol::ErrorCode;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::RoomError;

/// One entity of the room state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entity {
    /// Application-defined kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Current data.
    pub data: Value,
    /// Starts at 1, +1 per change.
    pub version: u64,
}

/// The room's entities, keyed by server-assigned ids (`e1`, `e2`, ...).
///
/// Ids are never reused within a room, so a stale reference can never hit a
/// newer entity.
///
/// Serializable with its id counter, as part of a [`crate::RoomState`].
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntityStore {
    #[serde(rename = "items")]
    entities: BTreeMap<String, Entity>,
    next_id: u64,
}

impl EntityStore {
    /// Creates an entity and returns it with its new id.
    pub fn create(&mut self, kind: Option<String>, data: Value) -> EntityInfo {
        self.next_id += 1;
        let id = format!("e{}", self.next_id);
        let entity = Entity {
            kind,
            data,
            version: 1,
        };
        let info = info(&id, &entity);
        self.entities.insert(id, entity);
        info
    }

    /// Looks an entity up.
    pub fn get(&self, id: &str) -> Option<&Entity> {
        self.entities.get(id)
    }

    /// Checks that `id` exists and, if `version` is given, that it is current.
    pub fn check(&self, id: &str, version: Option<u64>) -> Result<&Entity, RoomError> {
        let e = self.entities.get(id).ok_or_else(|| {
            RoomError::new(ErrorCode::EntityNotFound, format!("no entity {id:?}"))
        })?;
        match version {
            Some(v) if v != e.version => Err(RoomError::new(
                ErrorCode::VersionConflict,
                format!("entity {id:?} is at version {}, not {v}", e.version),
            )),
            _ => Ok(e),
        }
    }

    /// Replaces an entity's data.
    pub fn set(
        &mut self,
        id: &str,
        data: Value,
        version: Option<u64>,
    ) -> Result<EntityInfo, RoomError> {
        self.check(id, version)?;
        let e = self.entities.get_mut(id).expect("checked above");
        e.data = data;
        e.version += 1;
        Ok(info(id, e))
    }

    /// Merges top-level fields into an entity's data; `null` removes a field.
    /// An entity whose data is not an object becomes one.
    pub fn patch(
        &mut self,
        id: &str,
        fields: Map<String, Value>,
        version: Option<u64>,
    ) -> Result<EntityInfo, RoomError> {
        self.check(id, version)?;
        let e = self.entities.get_mut(id).expect("checked above");
        if !e.data.is_object() {
            e.data = Value::Object(Map::new());
        }
        let obj = e.data.as_object_mut().expect("made an object above");
        for (k, v) in fields {
            if v.is_null() {
                obj.remove(&k);
            } else {
                obj.insert(k, v);
            }
        }
        e.version += 1;
        Ok(info(id, e))
    }

    /// Deletes an entity, returning the version it had.
    pub fn delete(&mut self, id: &str, version: Option<u64>) -> Result<u64, RoomError> {
        let v = self.check(id, version)?.version;
        self.entities.remove(id);
        Ok(v)
    }

    /// Every entity, ordered by id.
    pub fn snapshot(&self) -> Vec<EntityInfo> {
        self.entities.iter().map(|(id, e)| info(id, e)).collect()
    }

    /// Number of entities.
    pub fn len(&self) -> usize {
        self.entities.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.entities.is_empty()
    }

    /// Whether every id was issued by the counter, so no future id repeats one
    /// (checked on a state loaded from elsewhere).
    pub(crate) fn ids_below_counter(&self) -> bool {
        self.entities.keys().all(|id| {
            id.strip_prefix('e')
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n <= self.next_id)
        })
    }
}

fn info(id: &str, e: &Entity) -> EntityInfo {
    EntityInfo {
        id: id.to_owned(),
        kind: e.kind.clone(),
        data: e.data.clone(),
        version: e.version,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn versions_guard_every_change() {
        let mut s = EntityStore::default();
        let a = s.create(Some("node".into()), json!({"x": 1}));
        assert_eq!((a.id.as_str(), a.version), ("e1", 1));
        assert_eq!(
            s.set("e1", json!({"x": 2}), Some(2)).unwrap_err().code,
            ErrorCode::VersionConflict
        );
        let b = s.set("e1", json!({"x": 2, "y": 3}), Some(1)).unwrap();
        assert_eq!(b.version, 2);
        let mut m = Map::new();
        m.insert("y".into(), Value::Null);
        m.insert("z".into(), json!(true));
        let c = s.patch("e1", m, None).unwrap();
        assert_eq!(c.data, json!({"x": 2, "z": true}));
        assert_eq!(c.version, 3);
        assert_eq!(
            s.delete("e1", Some(2)).unwrap_err().code,
            ErrorCode::VersionConflict
        );
        assert_eq!(s.delete("e1", Some(3)).unwrap(), 3);
        assert_eq!(s.get("e1"), None);
        assert_eq!(
            s.delete("e1", None).unwrap_err().code,
            ErrorCode::EntityNotFound
        );
        // ids are never reused
        assert_eq!(s.create(None, Value::Null).id, "e2");
    }
}
