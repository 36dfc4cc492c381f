//! The flush handler: every store on this node makes its acknowledged writes durable. The
//! answer carries the node's incarnation (`incarnation.rs`): a client whose writes this node
//! acknowledged in another one knows they may be lost.

use crate::error::engine_to_wire;
use crate::service::NodeShared;
use basalt_proto::{Response, WireError};
use basalt_types::Epoch;

pub(crate) async fn flush(node: &NodeShared, epoch: Epoch) -> Result<Response, WireError> {
    node.maps.admit(epoch).await?;
    let flushes = node.maps.stores().values().map(|store| store.flush());
    futures::future::try_join_all(flushes)
        .await
        .map_err(engine_to_wire)?;
    Ok(Response::Flushed {
        incarnation: node.incarnation,
    })
}
