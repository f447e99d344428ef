"""The cache as an OCI image: ``ctbuild cache push`` / ``pull`` over a registry or an OCI image layout.

An image is one layer: the cache bundle (:mod:`ctbuild.cache.bundle`), gzip-compressed, as a standard
``application/vnd.oci.image.layer.v1.tar+gzip`` layer, so registries, ``skopeo``, GKM's extractor
and Kubernetes image volumes all take it as an ordinary image. Its config's labels and the
manifest's annotations say what is inside (see :mod:`ctbuild.cache.oci.image`). A signature is a separate
artifact whose ``subject`` is the image manifest (:mod:`ctbuild.cache.oci.referrers`).

Modules: ``reference`` (parse ``host/repo:tag@digest``), ``registry`` (the distribution API over
urllib), ``layout`` (an OCI image layout on disk), ``referrers`` (attach and find signatures),
``image`` (build and push an image from a store; pull, check and import one), ``deadline`` (the
time limits of talking to a registry), ``commands`` (the ``push``, ``pull`` and ``keygen``
subcommands).
"""

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"
SIGNATURE_TYPE = "application/vnd.ctbuild.signature.v1+json"

#: Largest manifest, index or config read (bytes): real ones are a few KiB.
MAX_DOCUMENT = 4 * 2**20
#: Largest signature document read (bytes).
MAX_SIGNATURE = 64 * 2**10
#: ``--timeout``: seconds a push or pull may talk to a registry, from its first request.
DEFAULT_TIMEOUT_S = 1800.0
#: ``--read-timeout``: seconds one connect, read or write may wait for a registry.
DEFAULT_READ_TIMEOUT_S = 60.0
