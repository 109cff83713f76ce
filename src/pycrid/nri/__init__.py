"""NRI (Node Resource Interface): the wire protocol and the plugin SDK.

``pycrid.nri.api`` is the protocol's messages; ``Plugin`` (a plugin's base class) and
``Stub`` (its connection) run a plugin written in Python against any NRI runtime
(pycrid, containerd, CRI-O); ``Adjustment`` and ``Update`` build what handlers return.
The codecs live in ``pycrid.nri.wire``.
"""

from pycrid.nri import api
from pycrid.nri.replies import Adjustment, Update
from pycrid.nri.sdk_plugin import Plugin
from pycrid.nri.stub import PluginIdentityError, Stub, run

__all__ = ["Adjustment", "Plugin", "PluginIdentityError", "Stub", "Update", "api", "run"]
