//! The client's window on the metadata store: every call the client makes into `basalt-meta`
//! goes through here.

pub use basalt_meta::{
    Catalog, MetaError, MetaStore, PoolRecord, Revision, VolumeEvent, VolumeRecord, VolumeState,
    validate_volume_size,
};
use basalt_placement::ClusterMap;

/// Reads the published cluster map, if any.
pub(crate) async fn load_map(catalog: &Catalog) -> Result<Option<ClusterMap>, MetaError> {
    Ok(catalog
        .get_map::<ClusterMap>()
        .await?
        .map(|(map, _rev)| map))
}
