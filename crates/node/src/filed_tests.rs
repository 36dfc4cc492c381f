//! Failure reports whose put or delete was applied but not answered, over the real embedded
//! metadata store.

use super::*;
use crate::testing::Flaky;
use basalt_meta::NodeRecord;

/// Who the standing reports of `me` accuse.
async fn accused(catalog: &Catalog, me: NodeId) -> Vec<NodeId> {
    let reports = catalog.list_failure_reports().await.unwrap();
    reports
        .iter()
        .filter(|r| r.reporter == me)
        .map(|r| r.accused)
        .collect()
}

#[tokio::test]
async fn a_report_whose_answer_was_lost_is_withdrawn_and_a_lost_withdrawal_is_filed_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Flaky::open(&dir.path().join("meta.redb")).await;
    let catalog = Catalog::new(store.clone());
    let me = NodeId(1);
    let record = NodeRecord::new(me, "n1", "127.0.0.1:1");
    let _keep = catalog
        .register_node(&record, Duration::from_secs(60))
        .await
        .unwrap();
    let peer = NodeId(2);
    let silent = BTreeMap::from([(peer, Duration::from_secs(3))]);
    let mut filed = Filed::default();

    // Filed, but the answer is lost.
    store.lose_answers(true);
    assert!(filed.sync(&catalog, me, &silent).await.is_err());
    store.lose_answers(false);
    assert_eq!(accused(&catalog, me).await, vec![peer]);
    // The peer answers again: the report it does not know it filed is withdrawn.
    filed.sync(&catalog, me, &BTreeMap::new()).await.unwrap();
    assert!(accused(&catalog, me).await.is_empty(), "left standing");

    // Filed; then withdrawn, but that answer is lost; then the peer is cut off again.
    filed.sync(&catalog, me, &silent).await.unwrap();
    store.lose_answers(true);
    assert!(filed.sync(&catalog, me, &BTreeMap::new()).await.is_err());
    store.lose_answers(false);
    assert!(accused(&catalog, me).await.is_empty());
    filed.sync(&catalog, me, &silent).await.unwrap();
    assert_eq!(accused(&catalog, me).await, vec![peer], "not filed again");
}
