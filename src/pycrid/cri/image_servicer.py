"""runtime.v1.ImageService: protobuf in, core call, protobuf out; request shape checked here."""

from __future__ import annotations

import json
import time
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.core.cri_service import CRIService
from pycrid.errors import InvalidArgument
from pycrid.images.auth import Credentials
from pycrid.images.image_service import ImageView


def _image_pb(v: ImageView) -> Any:
    img = pb.Image(
        id=v.record.id, repo_tags=v.repo_tags, repo_digests=v.repo_digests, size=v.record.size,
        username=v.username, pinned=v.pinned, spec=pb.ImageSpec(image=v.record.id),
    )
    if v.uid is not None:
        img.uid.value = v.uid
    return img


def _spec_image(spec: Any, what: str) -> str:
    if spec is None or not spec.image:
        raise InvalidArgument(f"{what}: image reference is empty")
    return str(spec.image)


class ImageServicer:
    def __init__(self, core: CRIService) -> None:
        self.core = core

    async def ListImages(self, request: Any, context: Any) -> Any:
        ref = request.filter.image.image if request.HasField("filter") else ""
        views = self.core.images.list_images(ref)
        return pb.ListImagesResponse(images=[_image_pb(v) for v in views])

    async def ImageStatus(self, request: Any, context: Any) -> Any:
        view = self.core.images.status(_spec_image(request.image, "ImageStatus"))
        if view is None:
            # The CRI says: an absent image is not an error, the image field stays unset.
            return pb.ImageStatusResponse()
        info = {}
        if request.verbose:
            info["info"] = json.dumps(self.core.images.verbose_info(view.record))
        return pb.ImageStatusResponse(image=_image_pb(view), info=info)

    async def PullImage(self, request: Any, context: Any) -> Any:
        image = _spec_image(request.image, "PullImage")
        creds = None
        if request.HasField("auth"):
            a = request.auth
            creds = Credentials.from_cri(
                username=a.username, password=a.password, auth=a.auth,
                identity_token=a.identity_token, registry_token=a.registry_token)
        rec = await self.core.images.pull(image, creds)
        return pb.PullImageResponse(image_ref=rec.id)

    async def RemoveImage(self, request: Any, context: Any) -> Any:
        # Idempotent per the CRI: removing an absent image succeeds.
        await self.core.images.remove(_spec_image(request.image, "RemoveImage"))
        return pb.RemoveImageResponse()

    async def ImageFsInfo(self, request: Any, context: Any) -> Any:
        used, inodes, mountpoint = await self.core.images.fs_usage()
        usage = pb.FilesystemUsage(
            timestamp=time.time_ns(), fs_id=pb.FilesystemIdentifier(mountpoint=mountpoint))
        usage.used_bytes.value = used
        usage.inodes_used.value = inodes
        return pb.ImageFsInfoResponse(image_filesystems=[usage])
