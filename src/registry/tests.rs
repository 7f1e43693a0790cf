//! Unit tests of the registry: in, the embedded models.toml and small hand-written registries;
//! out, checks of its rules, lookups, download URLs, the list table and `--model` resolution.

use super::fetch::{download_url, host_of};
use super::*;

#[test]
fn embedded_registry_parses_and_passes_its_rules() {
    let reg = registry().expect("embedded registry");
    assert!(reg.models.len() >= 8, "only {} models", reg.models.len());
}

#[test]
fn known_models_are_there_with_their_facts() {
    let reg = registry().unwrap();
    for size in [256, 512, 1024, 2048] {
        let e = reg.find(&format!("GPEN-BFR-{size}")).expect("official entry");
        assert_eq!(e.input_size, size);
        assert_eq!(e.batch, Batch::Fixed1);
        assert_eq!(e.source, Source::Download);
        assert!(e.url.starts_with("https://"), "{}", e.url);
        assert_eq!(e.normalisation, "[-1,1] RGB NCHW");
    }
    assert_eq!(reg.find("GPEN-BFR-512").unwrap().bytes, 284_244_491);
    assert_eq!(reg.find("GPEN-BFR-256").unwrap().bytes, 75_715_262);
    assert_eq!(reg.find("GPEN-BFR-256").unwrap().template, "arcface_128");
    assert_eq!(reg.find("GPEN-BFR-512").unwrap().template, "ffhq");
    let r = reg.find("gpen-bfr-512-random").unwrap();
    assert_eq!((r.batch, r.source), (Batch::Dynamic, Source::Export));
    assert!(r.url.is_empty() && r.make.contains("gpen_export.py"));
    let c = reg.find("centerface").unwrap();
    assert_eq!(c.kind, Kind::Detector);
    assert!(is_sha256(&c.source_sha256));
    // Lookups ignore case.
    assert_eq!(reg.find("gpen-bfr-512").unwrap().name, "GPEN-BFR-512");
}

#[test]
fn every_entry_has_the_required_fields() {
    for e in &registry().unwrap().models {
        assert!(!e.name.is_empty() && e.file.ends_with(".onnx"), "{e:?}");
        assert!(!e.normalisation.is_empty(), "{}", e.name);
        assert!(e.sha256.is_empty() || is_sha256(&e.sha256), "{}: {}", e.name, e.sha256);
        match e.source {
            Source::Download => assert!(!e.url.is_empty(), "{}", e.name),
            _ => assert!(e.url.is_empty() && !e.make.is_empty(), "{}", e.name),
        }
        if e.kind == Kind::Enhancer {
            assert!(e.input_size > 0 && !e.template.is_empty(), "{}", e.name);
        }
    }
}

#[test]
fn names_and_files_are_unique() {
    let reg = registry().unwrap();
    let mut names: Vec<String> = reg.models.iter().map(|e| e.name.to_lowercase()).collect();
    let mut files: Vec<String> = reg.models.iter().map(|e| e.file.to_lowercase()).collect();
    let n = names.len();
    names.sort();
    names.dedup();
    files.sort();
    files.dedup();
    assert_eq!((names.len(), files.len()), (n, n));
}

fn one(extra: &str) -> String {
    format!(
        "[[model]]\nname = \"x\"\nkind = \"enhancer\"\nfile = \"x.onnx\"\nsource = \"download\"\n\
         url = \"https://example.invalid/x.onnx\"\nbatch = \"dynamic\"\ninput_size = 512\n\
         template = \"ffhq\"\nnormalisation = \"[-1,1] RGB NCHW\"\n{extra}"
    )
}

#[test]
fn the_rules_refuse_bad_entries() {
    assert!(Registry::parse(&one("sha256 = \"\"\n")).is_ok());
    // Hashes: empty or 64 lowercase hex digits.
    assert!(Registry::parse(&one("sha256 = \"abc\"\n")).is_err());
    assert!(Registry::parse(&one(&format!("sha256 = \"{}\"\n", "A".repeat(64)))).is_err());
    assert!(Registry::parse(&one(&format!("sha256 = \"{}\"\n", "a".repeat(64)))).is_ok());
    // Unknown fields (typos) and duplicate names.
    assert!(Registry::parse(&one("sha = \"\"\n")).is_err());
    let twice = format!(
        "{}\n{}",
        one(""),
        one("").replace("x.onnx", "y.onnx").replace("\"x\"", "\"X\"")
    );
    assert!(Registry::parse(&twice).is_err());
    // A download needs a URL.
    assert!(Registry::parse(&one("").replace("url = \"https://example.invalid/x.onnx\"\n", "")).is_err());
    assert!(Registry::parse(&one("").replace("\"ffhq\"", "\"square\"")).is_err());
}

#[test]
fn download_url_prefers_flag_then_mirror_base_then_registry() {
    let reg = registry().unwrap();
    let e = reg.find("GPEN-BFR-1024").unwrap();
    assert_eq!(download_url(e, None, None).unwrap(), e.url);
    assert_eq!(
        download_url(e, None, Some("http://127.0.0.1:9/m/")).unwrap(),
        "http://127.0.0.1:9/m/GPEN-BFR-1024.onnx"
    );
    assert_eq!(
        download_url(e, None, Some("")).unwrap(),
        e.url,
        "an empty base is ignored"
    );
    assert_eq!(
        download_url(e, Some("http://h/x.onnx"), Some("http://127.0.0.1:9")).unwrap(),
        "http://h/x.onnx"
    );
    let x = reg.find("gpen-bfr-256-random").unwrap();
    let err = download_url(x, None, None).unwrap_err().to_string();
    assert!(err.contains(&x.make) && err.contains("not published"), "{err}");
    assert_eq!(
        download_url(x, None, Some("http://127.0.0.1:9")).unwrap(),
        "http://127.0.0.1:9/gpen-bfr-256-random.onnx"
    );
}

#[test]
fn host_is_taken_from_the_url() {
    assert_eq!(host_of("http://127.0.0.1:8080/a/b.onnx"), "127.0.0.1:8080");
    assert_eq!(host_of("https://example.org"), "example.org");
}

#[test]
fn list_shows_every_model() {
    let t = list_table().unwrap();
    for e in &registry().unwrap().models {
        assert!(t.contains(&e.name), "{} missing from\n{t}", e.name);
    }
    assert!(t.lines().next().unwrap().starts_with("NAME"));
}

#[test]
fn resolve_model_refuses_an_unknown_name_and_passes_paths() {
    let err = resolve_model("no-such-model").unwrap_err().to_string();
    assert!(err.contains("neither a file nor a known model name"), "{err}");
    assert_eq!(
        resolve_model("some/dir/m.onnx").unwrap(),
        PathBuf::from("some/dir/m.onnx")
    );
}

/// The names people know for other restorers are registered with their facts, and CodeFormer's
/// default fidelity is found by its name or its file.
#[test]
fn other_restorers_are_known_by_their_names() {
    let reg = registry().unwrap();
    for name in [
        "codeformer",
        "gfpgan-1.2",
        "gfpgan-1.3",
        "gfpgan-1.4",
        "restoreformer-pp",
        "gpen-bfr-256",
        "GPEN-BFR-2048",
    ] {
        let e = reg.find(name).unwrap_or_else(|| panic!("{name} is not registered"));
        assert_eq!(e.kind, Kind::Enhancer, "{name}");
    }
    assert_eq!(reg.find("gpen-bfr-256").unwrap().template, "arcface_128");
    assert_eq!(reg.find("codeformer").unwrap().template, "ffhq");
}

/// The batch rewrite changes only what a batch-1 file declares, and refuses a file that declares
/// no batch of 1 or has no such input.
#[test]
fn the_batch_rewrite_frees_only_a_declared_batch_of_one() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/standin");
    let one = std::fs::read(root.join("ff-gpen-bfr-256.onnx")).unwrap();
    let (plain, changed) = rebatch::symbolic(&one, "input", false).unwrap();
    assert_eq!(changed, 0);
    let (freed, changed) = rebatch::symbolic(&one, "input", true).unwrap();
    assert_eq!(changed, 2, "both reshape shapes start with the batch");
    for bytes in [&plain, &freed] {
        let m = onnx_rs::parse(bytes).unwrap();
        let g = m.graph.as_ref().unwrap();
        for v in g.input.iter().chain(&g.output) {
            let dims = v.tensor_shape().unwrap();
            assert_eq!(
                dims.dim[0].value,
                onnx_rs::ast::Dimension::Param(rebatch::SYMBOL),
                "{}",
                v.name
            );
        }
        assert!(m.metadata_props.iter().any(|p| p.key == "gpen_video.batch"));
    }
    let dynamic = std::fs::read(root.join("identity-512.onnx")).unwrap();
    let err = rebatch::symbolic(&dynamic, "input", false).unwrap_err().to_string();
    assert!(err.contains("does not declare a batch of 1"), "{err}");
    let err = rebatch::symbolic(&one, "image", false).unwrap_err().to_string();
    assert!(err.contains("no input `image`"), "{err}");
    assert!(rebatch::symbolic(b"not onnx at all", "input", false).is_err());
}

/// A user entry names an absolute file; two may share one (other templates), a registry's may not.
#[test]
fn user_entries_name_absolute_files() {
    let entry = |name: &str, file: &str, source: &str| {
        format!(
            "[[model]]\nname = \"{name}\"\nkind = \"enhancer\"\nfile = \"{file}\"\nsource = \"{source}\"\nbatch = \"dynamic\"\ninput_size = 256\ntemplate = \"ffhq\"\nnormalisation = \"x\"\nmake = \"m\"\n"
        )
    };
    let e = Registry::parse(&entry("a", "m.onnx", "user")).unwrap_err();
    assert!(format!("{e:#}").contains("absolute path"), "{e:#}");
    Registry::parse(&(entry("a", "/x/m.onnx", "user") + &entry("b", "/x/m.onnx", "user"))).unwrap();
    let e = Registry::parse(&(entry("a", "m.onnx", "export") + &entry("b", "m.onnx", "export"))).unwrap_err();
    assert!(format!("{e:#}").contains("used by another entry"), "{e:#}");
}

#[test]
fn every_registry_name_is_a_name_models_add_takes() {
    for e in &registry().unwrap().models {
        assert!(name_ok(&e.name), "{}", e.name);
    }
    for good in ["x", "gfpgan-1.4", "My_model+v2", "a.b-c_d", &"n".repeat(64)] {
        assert!(name_ok(good), "{good}");
    }
    let long = "n".repeat(65);
    for bad in [
        "", "-rf", "--x", ".hidden", "a b", "a\tb", "a\nb", "a;b", "a&b", "a|b", "$x", "a'b", "a\"b", "a*b", "a/b",
        "a`b", "é", &long,
    ] {
        assert!(!name_ok(bad), "{bad:?}");
    }
}

#[test]
fn weights_files_are_your_own_models_only_and_well_formed() {
    let sha = "a".repeat(64);
    let user = |file: &str, sha: &str| {
        format!(
            "[[model]]\nname = \"x\"\nkind = \"enhancer\"\nfile = \"/m/x.onnx\"\nsource = \"user\"\n\
             batch = \"dynamic\"\ninput_size = 256\ntemplate = \"ffhq\"\nnormalisation = \"[-1,1] RGB NCHW\"\n\
             [[model.data]]\nfile = \"{file}\"\nsha256 = \"{sha}\"\nbytes = 36\n"
        )
    };
    let reg = Registry::parse(&user("/m/x.weights", &sha)).unwrap();
    assert_eq!(reg.models[0].data[0].bytes, 36);
    // Written back as it was read.
    let again = Registry::parse(&toml::to_string(&reg).unwrap()).unwrap();
    assert_eq!(again.models[0].data, reg.models[0].data);
    assert!(Registry::parse(&user("x.weights", &sha)).is_err(), "a relative path");
    assert!(Registry::parse(&user("/m/x.weights", "abc")).is_err(), "a bad checksum");
    let listed = one(&format!(
        "[[model.data]]\nfile = \"/m/x.weights\"\nsha256 = \"{sha}\"\nbytes = 1\n"
    ));
    assert!(Registry::parse(&listed).is_err(), "only your own models");
}

#[test]
fn the_advice_on_a_mismatch_follows_where_the_model_came_from() {
    let reg = registry().unwrap();
    assert!(reg
        .find("GPEN-BFR-256")
        .unwrap()
        .mend()
        .contains("models fetch GPEN-BFR-256"));
    assert!(reg.find("centerface").unwrap().mend().contains("scripts/setup.sh"));
    assert!(reg
        .find("gpen-bfr-256-random")
        .unwrap()
        .mend()
        .contains("gpen_export.py"));
    let mut mine = reg.find("GPEN-BFR-256").unwrap().clone();
    mine.source = Source::User;
    mine.file = "/home/me/copy.onnx".into();
    mine.origin = "/home/me/mine.onnx".into();
    let advice = mine.mend();
    assert!(
        advice.contains("models add /home/me/mine.onnx --name GPEN-BFR-256") && !advice.contains("fetch"),
        "{advice}"
    );
}
