"""The mend of kwok's build (chatfleet_platform.common.gopatch): a watch resumes at its version, and a
source not as expected stops the build."""

import pytest
from chatfleet_platform.common import gopatch
from chatfleet_platform.common.config import BUILD_SCRIPT

pytestmark = pytest.mark.harness

# kwok v0.7.0's Option.setup, as its module holds it
SETUP = """func (o *Option) setup(opts *metav1.ListOptions) {
	if o.LabelSelector != "" {
		opts.LabelSelector = o.LabelSelector
	}
	if o.FieldSelector != "" {
		opts.FieldSelector = o.FieldSelector
	}
	if !o.EnableListPager || o.EnableStreamWatch {
		opts.ResourceVersion = "0"
	}
}
"""


def kwok_tree(tmp_path, text=SETUP):
    path = tmp_path / "pkg" / "utils" / "informer" / "event.go"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_kwoks_informers_set_version_0_only_where_the_caller_gave_none(tmp_path):
    """A reflector's watch carries the version it has seen; the mended setup keeps it, and still sets "0"
    on a first list or a sync (no version given)."""
    path = kwok_tree(tmp_path)
    assert gopatch.mend(tmp_path) == ["watch-resume"]
    mended = path.read_text()
    assert '(!o.EnableListPager || o.EnableStreamWatch) && opts.ResourceVersion == ""' in mended
    assert mended.count('opts.ResourceVersion = "0"') == 1
    assert mended.replace(gopatch.KWOK_MENDS[0][3], "") == SETUP.replace(gopatch.KWOK_MENDS[0][2], "")


def test_a_source_not_as_expected_is_refused_not_built(tmp_path):
    """Mended already, or an upstream version that changed the lines: the text is not found once."""
    kwok_tree(tmp_path)
    gopatch.mend(tmp_path)
    with pytest.raises(
        gopatch.PatchError, match=r"watch-resume: pkg/utils/informer/event\.go holds .* 0 times"
    ):
        gopatch.mend(tmp_path)
    assert gopatch.main(["kwok", str(tmp_path)]) == 1
    assert gopatch.main(["kwok"]) == 2


def test_the_build_mends_kwok_and_builds_again_a_binary_without_the_mends(tmp_path, capsys):
    """The build script keeps the command's line beside the binary (`patched`) and takes a cached kwok
    only where that line names these mends."""
    kwok_tree(tmp_path)
    assert gopatch.main(["kwok", str(tmp_path)]) == 0
    line = capsys.readouterr().out.strip()
    script = BUILD_SCRIPT.read_text()
    assert f'KWOK_MENDED="{line}"' in script
    assert 'gopatch kwok "$d"' in script
    assert "kwok) have_kwok ;;" in script
