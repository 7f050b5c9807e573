// A message type's URN literal is checked like urn!'s, on the literal.
use babel_idem::Message;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Message)]
#[message(urn = "urn:babel:orders created")]
struct OrderCreated {
    order_id: u64,
}

fn main() {}
