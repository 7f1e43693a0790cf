//! `gpen-video models add` and the user registry, end to end: a user's own batch-1 file gets a
//! checked copy with a symbolic batch that gives the same pixels at batch 4 as the file at batch
//! 1; a graph that ties its batch keeps batch 1; the template belongs to the model (a registry
//! name's, or `--template`); a recorded file that changed is refused until added again, and
//! `models verify` says to add it again, never to fetch it; weights kept beside a graph are
//! recorded and verified with it; `models remove` deletes the copy, never the user's file; adds
//! and removes at the same moment all hold; a name a shell would misread is refused. Every run
//! gets its own XDG folders.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;

/// A user's XDG config and data folders for one test.
struct User {
    dir: tempfile::TempDir,
}

impl User {
    fn new() -> Self {
        User {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let d = self.dir.path();
        vec![
            ("XDG_CONFIG_HOME", d.join("config").display().to_string()),
            ("XDG_DATA_HOME", d.join("data").display().to_string()),
        ]
    }

    fn run(&self, args: &[&dyn AsRef<std::ffi::OsStr>]) -> std::process::Output {
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        gpen_env(args, &env)
    }

    fn ok(&self, args: &[&dyn AsRef<std::ffi::OsStr>]) -> (String, String) {
        let out = self.run(args);
        let err = ok(&out);
        (String::from_utf8_lossy(&out.stdout).to_string(), err)
    }

    fn copies(&self) -> PathBuf {
        self.dir.path().join("data/gpen-video/models")
    }
}

/// The decoded frames of a video, one digest each.
fn frames(f: &Path) -> Vec<String> {
    framemd5(f, "0:v", false)
}

/// A private copy of a stand-in, as a user's own file.
fn users_file(dir: &Path, standin: &str) -> PathBuf {
    let p = dir.join(standin);
    std::fs::copy(asset(&format!("models/standin/{standin}")), &p).unwrap();
    p
}

#[test]
fn a_batch_one_file_gets_a_copy_that_gives_the_same_pixels_at_batch_four() {
    let (user, dir) = (User::new(), tempfile::tempdir().unwrap());
    // GPEN-BFR's contract with constant reshapes that name the batch: the copy frees them.
    let file = users_file(dir.path(), "ff-gpen-bfr-256.onnx");
    let before = std::fs::read(&file).unwrap();
    let (said, _) = user.ok(&[&"models", &"add", &file, &"--name", &"my-gpen"]);
    assert!(said.contains("symbolic batch") && said.contains("to the bit"), "{said}");
    assert_eq!(std::fs::read(&file).unwrap(), before, "the user's file is only read");
    assert!(user.copies().join("my-gpen.onnx").is_file());
    let (list, _) = user.ok(&[&"models", &"list"]);
    let row = list.lines().find(|l| l.starts_with("my-gpen ")).expect("listed");
    assert!(
        row.contains("dynamic") && row.contains("yours") && row.ends_with("yes"),
        "{row}"
    );

    let input = asset("samples/test/group.mkv");
    let one = dir.path().join("one.mkv");
    let four = dir.path().join("four.mkv");
    let (_, err_one) = user.ok(&[&input, &one, &"--model", &file]);
    let (_, err_four) = user.ok(&[&input, &four, &"--model", &"my-gpen"]);
    let (b1, b4) = (batches(&err_one), batches(&err_four));
    assert!(b1 >= 3 * b4, "the copy runs batches of four: {b1} vs {b4} batches");
    let (f1, f4) = (frames(&one), frames(&four));
    assert_eq!(f1.len(), f4.len());
    assert_eq!(f1, f4, "the same pixels at batch 4 as at batch 1");
    assert_ne!(
        f1,
        frames(&{
            let plain = dir.path().join("plain.mkv");
            user.ok(&[&input, &plain, &"--model", &asset("models/standin/identity-256.onnx")]);
            plain
        })
    );
}

#[test]
fn a_graph_that_ties_its_batch_keeps_batch_one_and_still_runs() {
    let (user, dir) = (User::new(), tempfile::tempdir().unwrap());
    let file = users_file(dir.path(), "ff-tied-256.onnx");
    let (said, _) = user.ok(&[&"models", &"add", &file, &"--name", &"tied"]);
    assert!(
        said.contains("batch stays at 1") && said.contains("ties the batch"),
        "{said}"
    );
    assert!(!user.copies().join("tied.onnx").exists(), "no copy left behind");
    let out = dir.path().join("out.mp4");
    let (_, err) = user.ok(&[
        &asset("samples/test/astronaut.mp4"),
        &out,
        &"--model",
        &"tied",
        &"--frames",
        &"4",
    ]);
    assert!(batches(&err) >= 4, "one crop per call: {err}");
    let (said, _) = user.ok(&[&"models", &"add", &file, &"--name", &"kept", &"--keep-batch"]);
    assert!(said.contains("stays at 1 (--keep-batch)"), "{said}");
}

/// The template belongs to the model: the same file added under the registry's `gpen-bfr-256`
/// aligns faces to arcface_128 (as facefusion does), under a name of the user's to ffhq, and
/// under that name with `--template arcface_128` as the registry's entry does.
#[test]
fn the_template_belongs_to_the_model() {
    let (user, dir) = (User::new(), tempfile::tempdir().unwrap());
    let file = users_file(dir.path(), "negate-256.onnx");
    let (said, _) = user.ok(&[&"models", &"add", &file, &"--name", &"gpen-bfr-256"]);
    assert!(
        said.contains("recorded GPEN-BFR-256") && said.contains("template arcface_128"),
        "{said}"
    );
    let input = asset("samples/test/astronaut.mp4");
    let run = |model: &str| {
        let out = dir.path().join(format!("{model}.mp4"));
        user.ok(&[&input, &out, &"--model", &model, &"--frames", &"4"]);
        frames(&out)
    };
    let arcface = run("gpen-bfr-256");
    user.ok(&[&"models", &"add", &file, &"--name", &"mine"]);
    let ffhq = run("mine");
    assert_ne!(arcface, ffhq, "two templates, two alignments");
    user.ok(&[
        &"models",
        &"add",
        &file,
        &"--name",
        &"mine",
        &"--template",
        &"arcface_128",
    ]);
    assert_eq!(run("mine"), arcface);
}

#[test]
fn a_changed_file_is_refused_and_remove_leaves_the_users_file() {
    let (user, dir) = (User::new(), tempfile::tempdir().unwrap());
    let file = users_file(dir.path(), "negate-256.onnx");
    user.ok(&[&"models", &"add", &file, &"--name", &"mine"]);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.extend_from_slice(b"\0\0");
    std::fs::write(&file, &bytes).unwrap();
    let out = dir.path().join("out.mp4");
    let r = user.run(&[&asset("samples/test/astronaut.mp4"), &out, &"--model", &"mine"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success() && err.contains("it changed") && err.contains("models add"),
        "{err}"
    );
    assert!(!out.exists());

    let batch1 = users_file(dir.path(), "identity-512-batch1.onnx");
    user.ok(&[&"models", &"add", &batch1, &"--name", &"id"]);
    let copy = user.copies().join("id.onnx");
    assert!(copy.is_file());
    let (said, _) = user.ok(&[&"models", &"remove", &"id"]);
    assert!(said.contains("removed id"), "{said}");
    assert!(
        !copy.exists() && batch1.is_file(),
        "the copy goes, the user's file stays"
    );
    let r = user.run(&[&"models", &"remove", &"id"]);
    assert!(String::from_utf8_lossy(&r.stderr).contains("no model of yours is called `id`"));
    for (bad, why) in [("a b", "--name `a b`"), ("../x", "--name `../x`")] {
        let r = user.run(&[&"models", &"add", &batch1, &"--name", &bad]);
        assert!(String::from_utf8_lossy(&r.stderr).contains(why), "{bad}");
    }
    let r = user.run(&[
        &"models",
        &"add",
        &asset("models/standin/bad-shape.onnx"),
        &"--name",
        &"bad",
    ]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success() && err.contains("does not fit a face restorer's I/O contract"),
        "{err}"
    );
}

/// A real architecture: GFPGAN v1.3/1.4's (GFPGANv1Clean, models/gfpgan_export.py; a narrow
/// network with random weights, its batch declared 1 as facefusion's files declare it) gets a
/// checked copy with a symbolic batch, and restores a video with the same pixels at batch 4 as
/// one face per call, and a still.
#[test]
fn a_real_gfpgan_export_declared_batch_one_runs_batched_with_the_same_pixels() {
    let (user, dir) = (User::new(), tempfile::tempdir().unwrap());
    let file = asset("models/gfpgan-512-narrow-random.onnx");
    let (said, _) = user.ok(&[&"models", &"add", &file, &"--name", &"gfpgan-1.4"]);
    assert!(said.contains("symbolic batch"), "{said}");
    let input = asset("samples/test/group.mkv");
    let run = |batch: &str| {
        let out = dir.path().join(format!("b{batch}.mkv"));
        let (_, err) = user.ok(&[
            &input,
            &out,
            &"--model",
            &"gfpgan-1.4",
            &"--batch",
            &batch,
            &"--frames",
            &"8",
        ]);
        (frames(&out), batches(&err))
    };
    let ((one, calls_one), (four, calls_four)) = (run("1"), run("4"));
    assert!(
        calls_one >= 3 * calls_four,
        "{calls_one} calls one by one, {calls_four} in fours"
    );
    assert_eq!(one, four, "the same pixels at batch 4 as one face per call");
    let plain = dir.path().join("plain.mkv");
    user.ok(&[
        &input,
        &plain,
        &"--model",
        &asset("models/standin/identity-512.onnx"),
        &"--frames",
        &"8",
    ]);
    assert_ne!(frames(&plain), four, "GFPGAN changed the faces");
    let still = dir.path().join("portrait.png");
    ffmpeg(&["-i", arg(&asset("samples/astronaut.png")), arg(&still)]);
    let out = dir.path().join("restored.png");
    user.ok(&[&still, &out, &"--model", &"gfpgan-1.4"]);
    assert!(out.is_file());
}

/// The names recorded in the user's list (read as the tool reads it).
fn recorded(user: &User) -> Vec<String> {
    let path = user.dir.path().join("config/gpen-video/models.toml");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Vec::new();
    };
    let reg = gpen_video::api::registry::Registry::parse(&text).expect("the list parses");
    reg.models.into_iter().map(|e| e.name).collect()
}

/// `models add` and `models remove` of different names at the same moment each hold: the list
/// is changed under a lock, read again there and replaced whole, so no change is lost.
#[test]
fn adds_and_removes_at_the_same_moment_all_hold() {
    let (user, dir) = (User::new(), tempfile::tempdir().unwrap());
    let file = users_file(dir.path(), "identity-256.onnx");
    let mut want: Vec<String> = Vec::new();
    for round in 0..5 {
        let names: Vec<String> = (0..4).map(|i| format!("r{round}-m{i}")).collect();
        std::thread::scope(|s| {
            for n in &names {
                let (user, file) = (&user, &file);
                s.spawn(move || user.ok(&[&"models", &"add", file, &"--name", n]));
            }
        });
        want.extend(names);
        let got = recorded(&user);
        for n in &want {
            assert!(got.contains(n), "round {round}: {n} was lost: {got:?}");
        }
    }
    // A remove and adds of other names at once (the remove is quicker than an add's check, so
    // it starts a little later, at a different moment each round).
    for round in 0..5 {
        let gone = format!("r{round}-m0");
        let new: Vec<String> = (0..2).map(|i| format!("new{round}-{i}")).collect();
        std::thread::scope(|s| {
            for n in &new {
                let (user, file) = (&user, &file);
                s.spawn(move || user.ok(&[&"models", &"add", file, &"--name", n]));
            }
            let (user, gone) = (&user, &gone);
            s.spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(25 * round + 40));
                user.ok(&[&"models", &"remove", gone])
            });
        });
        want.retain(|n| n != &gone);
        want.extend(new);
        let got = recorded(&user);
        assert!(!got.contains(&gone), "round {round}: {gone} came back: {got:?}");
        for n in &want {
            assert!(got.contains(n), "round {round}: {n} was lost: {got:?}");
        }
        assert_eq!(got.len(), want.len(), "{got:?}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(user.dir.path().join("config/gpen-video"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The identity stand-in with its weights in a file beside it (ONNX external data, as large
/// models are saved): the graph at `dir/NAME`, the weights at `dir/location`.
fn with_external_weights(dir: &Path, name: &str, location: &str) -> PathBuf {
    use onnx_rs::ast::{DataLocation, DataType, StringStringEntry, TensorProto};
    let bytes = std::fs::read(asset("models/standin/identity-256.onnx")).unwrap();
    let mut model = onnx_rs::parse(&bytes).unwrap();
    let graph = model.graph.as_mut().unwrap();
    let w = graph
        .initializer
        .iter_mut()
        .find(|t| t.name() == "w")
        .expect("weights `w`");
    let data: Vec<u8> = w.as_f32().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect();
    let length = data.len().to_string();
    *w = TensorProto::from_raw("w", w.dims().to_vec(), DataType::Float, &[])
        .with_data_location(DataLocation::External)
        .with_external_data(vec![
            StringStringEntry {
                key: "location",
                value: location,
            },
            StringStringEntry {
                key: "offset",
                value: "0",
            },
            StringStringEntry {
                key: "length",
                value: &length,
            },
        ]);
    let path = dir.join(name);
    std::fs::write(&path, onnx_rs::encode(&model)).unwrap();
    let weights = path.parent().unwrap().join(location);
    std::fs::create_dir_all(weights.parent().unwrap()).unwrap();
    std::fs::write(weights, data).unwrap();
    path
}

/// A model whose weights sit in a file beside it is recorded with that file's checksum too:
/// weights that change are a mismatch `models verify` names (with and without the path), and
/// weights outside the model's folder are refused.
#[test]
fn weights_beside_the_graph_are_recorded_and_verified() {
    let (user, dir) = (User::new(), tempfile::tempdir().unwrap());
    let file = with_external_weights(dir.path(), "ext.onnx", "ext.weights");
    let (said, _) = user.ok(&[&"models", &"add", &file, &"--name", &"ext"]);
    assert!(said.contains("recorded ext") && said.contains("ext.weights"), "{said}");
    let (all, _) = user.ok(&[&"models", &"verify"]);
    assert!(all.contains("ext.weights"), "{all}");
    user.ok(&[&"models", &"verify", &file]);

    // Other weights of the same size: the graph is unchanged.
    let weights = dir.path().join("ext.weights");
    let mut data = std::fs::read(&weights).unwrap();
    data[0] ^= 0x40;
    std::fs::write(&weights, &data).unwrap();
    for args in [vec!["models", "verify"], vec!["models", "verify", arg(&file)]] {
        let r = user.run(
            &args
                .iter()
                .map(|a| a as &dyn AsRef<std::ffi::OsStr>)
                .collect::<Vec<_>>(),
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        );
        assert!(!r.status.success(), "{args:?} passed: {text}");
        assert!(
            text.contains("MISMATCH") && text.contains(&weights.display().to_string()),
            "{args:?}: {text}"
        );
    }
    // Weights of another size are refused on use, as a changed graph is.
    data.push(0);
    std::fs::write(&weights, &data).unwrap();
    let out = dir.path().join("out.mp4");
    let r = user.run(&[&asset("samples/test/astronaut.mp4"), &out, &"--model", &"ext"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success() && err.contains("ext.weights") && err.contains("models add"),
        "{err}"
    );

    // Weights outside the model's folder.
    let inner = dir.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    let outside = with_external_weights(&inner, "out.onnx", "../outside.weights");
    let r = user.run(&[&"models", &"add", &outside, &"--name", &"outside"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success() && err.contains("../outside.weights") && err.contains("outside"),
        "{err}"
    );
}

/// `models verify` on one's own model that changed says to add it again, never to fetch it
/// (there is nothing to fetch: `models fetch NAME` knows no such model).
#[test]
fn verify_of_ones_own_changed_model_says_to_add_it_again() {
    let (user, dir) = (User::new(), tempfile::tempdir().unwrap());
    let file = users_file(dir.path(), "identity-256.onnx");
    user.ok(&[&"models", &"add", &file, &"--name", &"mine"]);
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    let r = user.run(&[&"models", &"verify"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success(), "{err}");
    assert!(
        err.contains("mine") && err.contains("models add") && err.contains(&file.display().to_string()),
        "{err}"
    );
    assert!(!err.contains("fetch"), "{err}");
    // Nothing of that name to fetch, as the old advice had it.
    let r = user.run(&[&"models", &"fetch", &"mine"]);
    assert!(!r.status.success());
}

/// A name is typed after `--model` and names a file: one that begins with `-` (an option to
/// the shell's eye) or that a shell would split or expand is refused, saying what a name holds.
#[test]
fn names_a_shell_would_misread_are_refused() {
    let (user, dir) = (User::new(), tempfile::tempdir().unwrap());
    let file = users_file(dir.path(), "identity-256.onnx");
    for bad in [
        "-rf", "--x", ".hidden", "a b", "a\tb", "a;b", "a&b", "a|b", "$x", "a'b", "a\"b", "a*b", "a`b", "",
    ] {
        let r = user.run(&[&"models", &"add", &file, &format!("--name={bad}")]);
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success(), "`{bad}` was accepted: {err}");
        assert!(
            err.contains(&format!("--name `{bad}`")) && err.contains("letters, digits"),
            "`{bad}`: {err}"
        );
    }
    assert!(recorded(&user).is_empty());
    for good in ["gpen-bfr-256-random", "My_model+v2", "x", "GPEN-BFR-256"] {
        user.ok(&[&"models", &"add", &file, &format!("--name={good}")]);
    }
}
