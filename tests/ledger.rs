//! `examples/ledger.rs`: every credit message delivered three times moves
//! the balance once, through the router, with the mark in the credit's own
//! SQLite transaction.

// The example's `main` is for `cargo run`; here its logic is the test.
#[allow(dead_code)]
#[path = "../examples/ledger.rs"]
mod ledger;

#[tokio::test]
async fn three_deliveries_of_each_credit_move_the_balance_once() {
    let dir = std::env::temp_dir().join(format!("babel-idem-ledger-test-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let outcome = ledger::replay(&dir.join("ledger.db"), 3).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    assert_eq!(
        outcome.acked, 15,
        "every delivery, duplicates too, is acked"
    );
    assert_eq!(outcome.balance, outcome.credited_once);
    assert_eq!(outcome.balance, 100);
    assert_eq!(outcome.marks, 5, "one mark per distinct message");
}

#[tokio::test]
async fn a_failing_credit_rolls_back_and_marks_nothing() {
    let dir = std::env::temp_dir().join(format!("babel-idem-ledger-test-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let ledger = ledger::Ledger::open(&dir.join("ledger.db")).await.unwrap();
    let bad = babel_idem::Envelope::new(
        "urn:babel:ledger:credited",
        serde_json::json!({"account": ledger::ACCOUNT, "amount": "ten"}),
    );
    for _ in 0..2 {
        assert!(ledger.deliver(bad.clone()).await.is_err());
    }
    assert_eq!(
        ledger.marks().await.unwrap(),
        0,
        "the rollback took the mark too"
    );
    assert_eq!(ledger.balance(ledger::ACCOUNT).await.unwrap(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
