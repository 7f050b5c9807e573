// A space in the namespace-specific string must be percent-encoded.
use babel_idem::urn;

fn main() {
    let _created = urn!("urn:babel:orders created");
}
