// A message type must say which URN it is routed by.
use babel_idem::Message;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Message)]
struct OrderCreated {
    order_id: u64,
}

fn main() {}
