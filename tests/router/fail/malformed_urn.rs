// A URN literal without the `urn:` scheme does not compile.
use babel_idem::urn;

fn main() {
    let _created = urn!("babel:orders:created");
}
