// urn! checks literals at compile time; a run-time string goes through Urn::parse.
use babel_idem::urn;

fn main() {
    let text = "urn:babel:orders:created";
    let _created = urn!(text);
}
