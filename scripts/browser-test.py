#!/usr/bin/env python3
"""The service's page in a real browser: Debian's chromium, headless, driven by Playwright.

Starts `gpen-video serve` on a loopback port (a jobs folder of its own), opens the page, chooses
a photo and a short clip at once, waits until both items are `done`, downloads both through
their links, and checks: the photo's bytes equal `gpen-video IN OUT`'s for the same flags, the
clip decodes with the source's frame count, Tab alone reaches the file chooser and a download
link, the browser's console saw no error. Then, as a person uses it: a film running is
cancelled (it reads cancelled, offers Remove, and Remove takes it away) while a photo sent after
it finishes first; a photo shows the faces found, Show faces draws their boxes over its
comparison and its zoom centres on the face; a clip without a face is warned of; progress
bars and download links are named and the list is no live region; the list comes back after a
reload and another browser sees none of it; a file over --max-job-mb is refused before any
upload. Saves screenshots (desktop 1366x768 and phone 390x844, light and dark) into --shots.

    scripts/browser-test.py [--bin target/release/gpen-video] [--shots out/browser]

Needs `chromium` (apt) and `playwright` (pip) in the set-up's venv: scripts/browser-test.sh
installs both and runs this.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from playwright.sync_api import sync_playwright

import serve_child

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ffmpeg(*args):
    subprocess.run(["ffmpeg", "-v", "error", "-y", *args], check=True)


def frames(path):
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=nb_read_frames", "-of", "csv=p=0", path],
        check=True, capture_output=True, text=True).stdout
    return int(out.strip())


def until(ok, seconds, what):
    end = time.time() + seconds
    while not ok():
        if time.time() > end:
            sys.exit(f"browser-test: FAILED: not {what} within {seconds} s")
        time.sleep(0.2)


def watch(page, problems):
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))


def item(page, name):
    return page.locator(".item", has=page.locator(".name", has_text=name)).first


def state_of(page, name):
    return item(page, name).get_attribute("data-state")


def check_cancel_and_lanes(page, film, photo2, problems):
    """A film running, a photo sent after it finishes first; the film cancelled shows cancelled,
    its Cancel gone and Remove there; Remove takes it off the list."""
    page.set_input_files("input[type=file]", [film])
    until(lambda: state_of(page, os.path.basename(film)) == "running", 60, "the film running")
    page.set_input_files("input[type=file]", [photo2])
    until(lambda: state_of(page, os.path.basename(photo2)) in ("done", "failed"), 60, "the photo done")
    if state_of(page, os.path.basename(film)) != "running":
        problems.append("the photo did not finish while the film was still running")
    it = item(page, os.path.basename(photo2))
    faces = it.locator(".faces").inner_text()
    if "face" not in faces or faces.startswith("0"):
        problems.append(f"the photo's faces read {faces!r}")
    if "of 1 frames" in it.inner_text():
        problems.append("a photo reads in frames")
    faithful = it.locator(".faithful")
    words = faithful.inner_text() if faithful.count() else ""
    if "identity 1.00" not in words or "as sharp as before" not in words:
        problems.append(f"the photo's faces do not say who they are and how sharp: {words!r}")
    f = item(page, os.path.basename(film))
    f.locator("button.cancel").click()
    until(lambda: state_of(page, os.path.basename(film)) == "cancelled", 30, "the film cancelled")
    if f.locator("button.cancel").is_visible() or not f.locator("button.remove").is_visible():
        problems.append("a cancelled film still offers Cancel, or offers no Remove")
    if "cancelled" not in f.locator(".status").inner_text():
        problems.append("a cancelled film does not read cancelled: " + f.locator(".status").inner_text())


def check_faces(page, name, problems):
    """Show faces draws the faces found over the photo's comparison; the zoom centres on the
    face (its transform-origin inside the face's box), wherever the pointer is."""
    it = item(page, name)
    show = it.locator("button.show-faces")
    try:
        show.wait_for(state="visible", timeout=15000)
    except Exception:
        problems.append("no Show faces button on the photo's comparison")
        return
    wrap = it.locator(".compare")
    show.click()
    if show.get_attribute("aria-pressed") != "true":
        problems.append("Show faces is not pressed once clicked")
    boxes = wrap.locator(".box")
    if boxes.count() < 1:
        problems.append("Show faces draws no box over the photo")
        return
    w, b = wrap.bounding_box(), boxes.first.bounding_box()
    if not (b["width"] > 4 and b["height"] > 4 and b["x"] >= w["x"] - 1 and b["y"] >= w["y"] - 1
            and b["x"] + b["width"] <= w["x"] + w["width"] + 1 and b["y"] + b["height"] <= w["y"] + w["height"] + 1):
        problems.append(f"the face's box {b} is not over the picture {w}")
    face = [(b["x"] - w["x"]) / w["width"] * 100, (b["y"] - w["y"]) / w["height"] * 100,
            (b["x"] + b["width"] - w["x"]) / w["width"] * 100, (b["y"] + b["height"] - w["y"]) / w["height"] * 100]
    # The pointer in a corner away from the face: the zoom still centres on the face.
    page.mouse.move(w["x"] + 2, w["y"] + w["height"] - 2)
    it.locator("button.zoom").click()
    page.mouse.move(w["x"] + w["width"] - 2, w["y"] + 2)
    origin = it.locator(".compare img.before").evaluate("e => e.style.transformOrigin")
    try:
        x, y = (float(v.rstrip("%")) for v in origin.split()[:2])
    except ValueError:
        problems.append(f"the zoom's origin reads {origin!r}")
        x = y = -1.0
    if not (face[0] <= x <= face[2] and face[1] <= y <= face[3]):
        problems.append(f"the zoom centres on {origin!r}, not in the face's box {face}")
    it.locator("button.zoom").click()
    show.click()
    if boxes.count():
        problems.append("the boxes stay once Show faces is off")


def check_noface(page, noface, problems):
    page.set_input_files("input[type=file]", [noface])
    until(lambda: state_of(page, os.path.basename(noface)) in ("done", "failed"), 90, "the no-face clip done")
    warn = item(page, os.path.basename(noface)).locator(".warn")
    if not warn.count() or "No face found" not in warn.inner_text():
        problems.append("no warning on a clip without a face")


def check_a11y(page, problems):
    if page.locator("#items").get_attribute("aria-live"):
        problems.append("the list is a live region")
    if page.locator("[role=status]#announce").count() != 1:
        problems.append("no status region for state changes")
    for p in page.locator(".item progress").all():
        if not (p.get_attribute("aria-label") or "").startswith("Progress of "):
            problems.append("a progress bar without a name")
    for a in page.locator(".item a.download").all():
        text, name = a.inner_text(), a.get_attribute("download")
        if text != "Download " + name or "-restored." not in name:
            problems.append(f"a download link reads {text!r}")
    handle = page.locator(".item .handle").first
    handle.focus()
    page.keyboard.press("ArrowRight")
    if handle.get_attribute("aria-valuenow") != "52":
        problems.append("the comparison's handle does not move by keyboard")


def check_reload(browser, ctx, page, url, problems):
    """The list comes back after a reload; another browser's key sees none of it."""
    before = sorted(i.get_attribute("data-id") for i in page.locator(".item").all())
    page.reload()
    page.wait_for_selector("#mask option", state="attached")
    until(lambda: page.locator(".item").count() == len(before), 30, "the list back after a reload")
    after = sorted(i.get_attribute("data-id") for i in page.locator(".item").all())
    if after != before:
        problems.append(f"after a reload the list holds {after}, before {before}")
    other = browser.new_context()
    op = other.new_page()
    op.goto(url)
    op.wait_for_selector("#mask option", state="attached")
    time.sleep(1)
    if op.locator(".item").count():
        problems.append("another browser sees this one's jobs")
    other.close()
    f = page.locator(".item[data-state=cancelled]").first
    f.locator("button.remove").click()
    until(lambda: page.locator(".item[data-state=cancelled]").count() == 0, 10, "the cancelled film removed")


def check_oversize(browser, a, env, work, problems):
    """A file over --max-job-mb is refused in the page: no upload is sent."""
    big = os.path.join(work, "big.mp4")
    with open(big, "wb") as f:
        f.write(os.urandom(3_000_000))
    server, base = serve_child.start(
        a.bin, ["--model", a.model, "--jobs-dir", os.path.join(work, "jobs-small"), "--max-job-mb", "1"],
        env, "browser-test")
    try:
        ctx = browser.new_context()
        page = ctx.new_page()
        watch(page, problems)
        posts = []
        page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
        page.goto(base + "/")
        page.wait_for_selector("#mask option", state="attached")
        page.set_input_files("input[type=file]", [big])
        until(lambda: page.locator(".item[data-state=failed]").count() == 1, 10, "the big file refused")
        text = page.locator(".item .error").inner_text()
        if "up to 1 MB" not in text or "--" in text:
            problems.append(f"the big file's refusal reads {text!r}")
        time.sleep(0.5)
        if posts:
            problems.append(f"the big file was sent: {posts}")
        ctx.close()
    finally:
        serve_child.stop(server)


def shots(browser, ctx, url, out, problems):
    """Desktop and phone, light and dark, with this browser's list; the dark page is dark."""
    state = ctx.storage_state()
    for scheme in ("light", "dark"):
        for name, vp, scale in (("desktop", (1366, 768), 1), ("phone", (390, 844), 2)):
            c = browser.new_context(viewport={"width": vp[0], "height": vp[1]}, device_scale_factor=scale,
                                    color_scheme=scheme, storage_state=state)
            p = c.new_page()
            watch(p, problems)
            p.goto(url)
            p.wait_for_selector(".item .compare img", state="attached")
            time.sleep(1)
            if scheme == "dark" and name == "desktop":
                bg = p.locator("body").evaluate("e => getComputedStyle(e).backgroundColor")
                rgb = [int(x) for x in bg[bg.index("(") + 1:bg.index(")")].split(",")[:3]]
                if sum(rgb) > 150:
                    problems.append(f"the dark page's background is {bg}")
            p.screenshot(path=os.path.join(out, f"{name}-{scheme}.jpg"), type="jpeg", quality=80)
            c.close()


def ux(browser, ctx, page, url, a, env, work, problems):
    film = os.path.join(work, "film.mp4")
    portrait = os.path.join(ROOT, "samples/astronaut.png")
    ffmpeg("-loop", "1", "-i", portrait, "-vf", "scale=640:640,crop=480:360:x='80+40*sin(t)':y=60,format=yuv420p",
           "-r", "25", "-t", "20", "-c:v", "libx264", "-preset", "ultrafast", film)
    photo2 = os.path.join(work, "second.jpg")
    ffmpeg("-i", portrait, "-vf", "scale=320:320", "-q:v", "3", photo2)
    noface = os.path.join(work, "noface.mp4")
    ffmpeg("-f", "lavfi", "-i", "testsrc=size=320x240:rate=25", "-t", "1", "-pix_fmt", "yuv420p",
           "-c:v", "libx264", "-preset", "ultrafast", noface)
    check_cancel_and_lanes(page, film, photo2, problems)
    check_noface(page, noface, problems)
    check_a11y(page, problems)
    check_reload(browser, ctx, page, url, problems)
    check_oversize(browser, a, env, work, problems)
    shots(browser, ctx, url, a.shots, problems)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/gpen-video"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/standin/identity-256.onnx"))
    ap.add_argument("--browser", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--shots", default=os.path.join(ROOT, "out/browser"))
    a = ap.parse_args()
    os.makedirs(a.shots, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("ORT_DYLIB_PATH", os.path.join(ROOT, ".deps/lib/libonnxruntime.so"))
    work = tempfile.mkdtemp(prefix="gpen-browser-")
    server = None
    try:
        photo, clip = os.path.join(work, "portrait.jpg"), os.path.join(work, "clip.mp4")
        portrait = os.path.join(ROOT, "samples/astronaut.png")
        ffmpeg("-i", portrait, "-vf", "scale=384:384", "-q:v", "3", photo)
        ffmpeg("-loop", "1", "-i", portrait, "-vf",
               "scale=640:640,crop=480:360:x='80+40*sin(t)':y=60,format=yuv420p", "-r", "25",
               "-t", "2", "-c:v", "libx264", "-preset", "ultrafast", clip)
        want_photo = os.path.join(work, "cli.jpg")
        subprocess.run([a.bin, photo, want_photo, "--model", a.model, "-q"], check=True, env=env,
                       capture_output=True)
        # A user's CodeFormer (the stand-in of its contract), recorded by name: the page offers it
        # with its fidelity slider, and a job sent at fidelity 0 equals the CLI's at 0.
        env["XDG_CONFIG_HOME"] = os.path.join(work, "config")
        env["XDG_DATA_HOME"] = os.path.join(work, "data")
        subprocess.run([a.bin, "models", "add", os.path.join(ROOT, "models/standin/codeformer-512.onnx"),
                        "--name", "codeformer"], check=True, env=env, capture_output=True)
        want_faithful = os.path.join(work, "cli-faithful.jpg")
        subprocess.run([a.bin, photo, want_faithful, "--model", "codeformer", "--fidelity", "0", "-q"],
                       check=True, env=env, capture_output=True)

        env["XDG_STATE_HOME"] = os.path.join(work, "state")
        server, base = serve_child.start(
            a.bin, ["--model", a.model, "--jobs-dir", os.path.join(work, "jobs")], env, "browser-test")
        url = base + "/"

        problems = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=a.browser, args=["--no-sandbox"])
            ctx = browser.new_context(viewport={"width": 1100, "height": 900}, accept_downloads=True)
            page = ctx.new_page()
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto(url)
            page.wait_for_selector("#mask option", state="attached")
            # The colour fix and the identity guard start at the service's own settings.
            fix, guard = page.locator("#color-fix").input_value(), page.locator("#identity-guard").input_value()
            if (fix, guard) != ("wavelet", "back-off"):
                problems.append(f"the colour fix and the guard start at {fix!r} and {guard!r}")
            page.set_input_files("input[type=file]", [photo, clip])
            # Polled through locators (the page's Content-Security-Policy allows no eval, which
            # wait_for_function would need).
            finished = ".item[data-state=done], .item[data-state=failed]"
            until(lambda: page.locator(finished).count() == 2, 240, "both items done")
            failed = page.locator(".item[data-state=failed]")
            if failed.count():
                sys.exit("browser-test: FAILED: " + " | ".join(failed.all_inner_texts()))
            # Each result's link comes after its comparison is drawn.
            until(lambda: page.locator(".item a[download]").count() == 2, 60, "both download links")
            check_faces(page, "portrait.jpg", problems)
            # By keyboard alone: Tab from the top reaches the file chooser first, then (past the
            # controls and each result's slider) a download link.
            page.locator("body").click(position={"x": 5, "y": 5})
            page.keyboard.press("Tab")
            if page.locator("#file:focus").count() != 1:
                problems.append("Tab from the top does not reach the file chooser first")
            for _ in range(40):
                if page.locator("a[download]:focus").count():
                    break
                page.keyboard.press("Tab")
            else:
                problems.append("Tab never reaches a download link")
            got = {}
            for item in page.locator(".item").all():
                name = item.locator(".name").inner_text()
                with page.expect_download() as d:
                    item.locator("a[download]").click()
                path = os.path.join(work, "got-" + d.value.suggested_filename)
                d.value.save_as(path)
                got[name] = path
            page.screenshot(path=os.path.join(a.shots, "page.jpg"), type="jpeg", quality=80)
            # The restorers by name; CodeFormer's fidelity slider shows only for CodeFormer.
            options = page.locator("#model-select option").all_inner_texts()
            if not any(o.startswith("codeformer") for o in options):
                problems.append(f"codeformer is not offered: {options}")
            if page.locator("#fidelity-field").is_visible():
                problems.append("the fidelity slider shows for a model without a fidelity input")
            page.select_option("#model-select", "codeformer")
            if not page.locator("#fidelity-field").is_visible():
                problems.append("no fidelity slider for codeformer")
            elif page.locator("#fidelity").input_value() != "0.5":
                problems.append("codeformer's slider does not start at its default 0.5")
            page.locator("#fidelity").fill("0")
            page.screenshot(path=os.path.join(a.shots, "fidelity.jpg"), type="jpeg", quality=80)
            faithful = os.path.join(work, "faithful", "portrait.jpg")
            os.makedirs(os.path.dirname(faithful))
            shutil.copy(photo, faithful)
            page.set_input_files("input[type=file]", [faithful])
            until(lambda: page.locator(".item a[download]").count() == 3, 120, "the codeformer photo's link")
            with page.expect_download() as d:
                page.locator(".item").first.locator("a[download]").click()
            got_faithful = os.path.join(work, "got-faithful.jpg")
            d.value.save_as(got_faithful)
            phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2)
            pp = phone.new_page()
            pp.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            pp.goto(url)
            pp.wait_for_selector("#mask option", state="attached")
            pp.screenshot(path=os.path.join(a.shots, "phone.jpg"), type="jpeg", quality=80)
            ux(browser, ctx, page, url, a, env, work, problems)
            browser.close()

        with open(got["portrait.jpg"], "rb") as f, open(want_photo, "rb") as g:
            if f.read() != g.read():
                problems.append("the photo downloaded differs from gpen-video IN OUT's")
        with open(got_faithful, "rb") as f, open(want_faithful, "rb") as g:
            if f.read() != g.read():
                problems.append("codeformer at fidelity 0 from the page differs from the CLI's")
        n, m = frames(got["clip.mp4"]), frames(clip)
        if n != m:
            problems.append(f"the clip downloaded has {n} frames, the source {m}")
        if problems:
            sys.exit("browser-test: FAILED:\n  " + "\n  ".join(problems))
        print(f"browser-test: ok: photo equal to the CLI's, clip of {n} frames, no console error; "
              f"screenshots in {a.shots}")
    finally:
        serve_child.stop(server)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
