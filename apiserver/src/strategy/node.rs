//! Nodes: the node agent registers a node with its status (capacity,
//! addresses) in the create, so unlike other kinds with a status
//! subresource, a Node keeps the status it is created with.

use serde_json::Value;
use skiff_api::resources::ResourceInfo;

use super::Strategy;

pub struct Node;

impl Strategy for Node {
    fn prepare_for_create(&self, _info: &ResourceInfo, _obj: &mut Value) {}
}
