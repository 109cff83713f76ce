"""runtime.v1.ImageService: protobuf in, core call, protobuf out; request shape checked here."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import cast

from cri_api.v1 import api_pb2 as pb

from pycrid.core.cri_service import CRIService
from pycrid.cri.handler_types import Context
from pycrid.errors import InvalidArgument
from pycrid.images.auth import Credentials
from pycrid.images.image_service import ImageView


def _image_pb(v: ImageView) -> pb.Image:
    img = pb.Image(
        id=v.record.id, repo_tags=v.repo_tags, repo_digests=v.repo_digests, size=v.record.size,
        username=v.username, pinned=v.pinned, spec=pb.ImageSpec(image=v.record.id),
    )
    if v.uid is not None:
        img.uid.value = v.uid
    return img


def _spec_image(spec: pb.ImageSpec | None, what: str) -> str:
    if spec is None or not spec.image:
        raise InvalidArgument(f"{what}: image reference is empty")
    return str(spec.image)


class ImageServicer:
    def __init__(self, core: CRIService) -> None:
        self.core = core

    async def ListImages(
        self, request: pb.ListImagesRequest,
        context: Context[pb.ListImagesRequest, pb.ListImagesResponse],
    ) -> pb.ListImagesResponse:
        ref = request.filter.image.image if request.HasField("filter") else ""
        views = self.core.images.list_images(ref)
        return pb.ListImagesResponse(images=[_image_pb(v) for v in views])

    async def ImageStatus(
        self, request: pb.ImageStatusRequest,
        context: Context[pb.ImageStatusRequest, pb.ImageStatusResponse],
    ) -> pb.ImageStatusResponse:
        view = self.core.images.status(_spec_image(request.image, "ImageStatus"))
        if view is None:
            # The CRI says: an absent image is not an error, the image field stays unset.
            return pb.ImageStatusResponse()
        info: dict[str, str] = {}
        if request.verbose:
            # A JSON object (typed with Any in the image service).
            verbose = cast("Mapping[str, object]", self.core.images.verbose_info(view.record))
            info["info"] = json.dumps(verbose)
        return pb.ImageStatusResponse(image=_image_pb(view), info=info)

    async def PullImage(
        self, request: pb.PullImageRequest,
        context: Context[pb.PullImageRequest, pb.PullImageResponse],
    ) -> pb.PullImageResponse:
        image = _spec_image(request.image, "PullImage")
        creds = None
        if request.HasField("auth"):
            a = request.auth
            creds = Credentials.from_cri(
                username=a.username, password=a.password, auth=a.auth,
                identity_token=a.identity_token, registry_token=a.registry_token)
        # The pod's namespace picks its signature policy (signature_policy_dir).
        namespace = str(request.sandbox_config.metadata.namespace)
        rec = await self.core.images.pull(image, creds, namespace)
        return pb.PullImageResponse(image_ref=rec.id)

    async def RemoveImage(
        self, request: pb.RemoveImageRequest,
        context: Context[pb.RemoveImageRequest, pb.RemoveImageResponse],
    ) -> pb.RemoveImageResponse:
        # Idempotent per the CRI: removing an absent image succeeds.
        await self.core.images.remove(_spec_image(request.image, "RemoveImage"))
        return pb.RemoveImageResponse()

    async def ImageFsInfo(
        self, request: pb.ImageFsInfoRequest,
        context: Context[pb.ImageFsInfoRequest, pb.ImageFsInfoResponse],
    ) -> pb.ImageFsInfoResponse:
        used, inodes, mountpoint = await self.core.images.fs_usage()
        usage = pb.FilesystemUsage(
            timestamp=time.time_ns(), fs_id=pb.FilesystemIdentifier(mountpoint=mountpoint))
        usage.used_bytes.value = used
        usage.inodes_used.value = inodes
        return pb.ImageFsInfoResponse(image_filesystems=[usage])
