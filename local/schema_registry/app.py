"""HTTP face of the local schema registry: the subset of Confluent's REST API that
confluent-kafka's SchemaRegistryClient and Avro serdes call, with Confluent's error bodies."""

from __future__ import annotations

import base64
import hmac
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

import anyio.to_thread
import avro.schema
from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from local.schema_registry import compat
from local.schema_registry.store import (
    ID_HIGH_WATER_KEY,
    RegistryState,
    SchemaStore,
    SchemaVersion,
    StoreError,
    config_key,
    replay,
)
from services.contracts import registry as registry_contract

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/vnd.schemaregistry.v1+json"
MAX_VERSION = 2**31 - 1


class RegistryJSONResponse(JSONResponse):
    media_type = MEDIA_TYPE


# -- errors: Confluent's codes (io.confluent.kafka.schemaregistry.rest.exceptions.Errors) ------


class RegistryError(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def _version_not_found(subject: str, version: int) -> RegistryError:
    return RegistryError(404, 40402, f"Version {version} not found for subject '{subject}'.")


def _schema_not_found(detail: str = "Schema not found") -> RegistryError:
    return RegistryError(404, 40403, detail)


def _invalid_schema(message: str) -> RegistryError:
    return RegistryError(422, 42201, message)


def _invalid_level(got: object) -> RegistryError:
    return RegistryError(
        422,
        42203,
        f"Invalid compatibility level {got!r}. Valid values are none, backward, forward, full, "
        "backward_transitive, forward_transitive, and full_transitive",
    )


# -- request and response bodies -------------------------------------------------------------


class SchemaRequest(BaseModel):
    """Body of register, lookup and compatibility calls (Confluent's RegisterSchemaRequest)."""

    model_config = ConfigDict(extra="ignore")

    schema_: str = Field(alias="schema")
    schemaType: str = "AVRO"
    references: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] | None = None
    ruleSet: dict[str, Any] | None = None


class ConfigUpdate(BaseModel):
    """Body of PUT /config; only the compatibility level is stored by this registry."""

    model_config = ConfigDict(extra="allow")

    compatibility: str | None = None
    compatibilityLevel: str | None = None  # accepted as an alias, like Confluent does


class RegisterResponse(BaseModel):
    id: int
    subject: str
    version: int


class SubjectVersionResponse(BaseModel):
    subject: str
    version: int
    id: int
    schema_: str = Field(alias="schema")


class SchemaResponse(BaseModel):
    schema_: str = Field(alias="schema")


class SchemaUsage(BaseModel):
    subject: str
    version: int


class CompatibilityResponse(BaseModel):
    is_compatible: bool
    messages: list[str] | None = None


class ConfigResponse(BaseModel):
    compatibilityLevel: compat.Level


class ConfigUpdateResponse(BaseModel):
    compatibility: compat.Level


class ModeResponse(BaseModel):
    mode: str


# -- the registry's operations, free of HTTP -------------------------------------------------


class Registry:
    """Schema ids, subjects, versions and levels over a SchemaStore.

    One lock serialises everything: a registration reads the state, allocates an id and a
    version and writes them, and two of those must not interleave. The state is (re)built from
    the store at start and whenever a write's outcome is unknown.
    """

    def __init__(self, store: SchemaStore) -> None:
        self._store = store
        self._state = RegistryState()
        self._stale = True
        self._lock = threading.RLock()
        # A write whose outcome is unknown may still become visible later (appended by the
        # leader, committed once followers catch up): its id and version are never handed out
        # again by this process.
        self._burnt_id = 0
        self._burnt_versions: dict[str, int] = {}

    def load(self) -> None:
        with self._lock:
            try:
                self._state = replay(self._store)
            except StoreError as e:
                raise RegistryError(500, 50001, f"Error in the backend data store - {e}") from e
            self._stale = False
            log.info(
                "state loaded: %d subjects, max id %d",
                len(self._state.subjects),
                self._state.max_id,
            )

    @contextmanager
    def _locked(self) -> Iterator[RegistryState]:
        with self._lock:
            if self._stale:
                self.load()
            yield self._state

    def _write(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        try:
            self._store.append(key, value)
        except Exception as e:
            # the record may or may not have landed: re-read the log before the next request
            self._stale = True
            if key.get("keytype") == "SCHEMA" and value is not None:
                self._burnt_id = max(self._burnt_id, int(value["id"]))
                subject, version = str(key["subject"]), int(key["version"])
                self._burnt_versions[subject] = max(self._burnt_versions.get(subject, 0), version)
            if isinstance(e, StoreError):
                raise RegistryError(500, 50001, f"Error in the backend data store - {e}") from e
            raise
        self._state.apply(key, value)

    # -- helpers -------------------------------------------------------------------------
    @staticmethod
    def _parse(req: SchemaRequest) -> avro.schema.Schema:
        if req.schemaType.upper() != "AVRO":
            raise _invalid_schema(f"Schema type {req.schemaType} is not supported (AVRO only)")
        if req.references:
            raise _invalid_schema("Schema references are not supported by this registry")
        if req.metadata or req.ruleSet:
            raise _invalid_schema("Schema metadata and rule sets are not supported")
        try:
            return compat.parse_schema(req.schema_)
        except compat.InvalidSchema as e:
            raise _invalid_schema(str(e)) from None

    @staticmethod
    def _level(state: RegistryState, subject: str | None) -> compat.Level:
        return state.configs.get(subject) or state.configs.get(None) or compat.DEFAULT_LEVEL

    @staticmethod
    def _live(state: RegistryState, subject: str, deleted: bool = False) -> list[SchemaVersion]:
        found = state.versions(subject, deleted=deleted)
        if not found:
            raise _subject_not_found(subject)
        return found

    @staticmethod
    def _select(found: list[SchemaVersion], subject: str, version: str) -> SchemaVersion:
        """`version` ("latest", -1 or a number) among `found`, the caller's filtered list."""
        number = parse_version(version)
        if number is None:
            if not found:
                raise _subject_not_found(subject)
            return found[-1]
        for v in found:
            if v.version == number:
                return v
        raise _version_not_found(subject, number)

    @staticmethod
    def _check(
        level: compat.Level, new: avro.schema.Schema, against: list[SchemaVersion]
    ) -> compat.Verdict:
        old = [compat.parse_schema(v.schema) for v in against]
        labels = [f"version {v.version}" for v in against]
        return compat.check(level, new, old, labels)

    # -- subjects and versions -----------------------------------------------------------
    def subjects(self, prefix: str, deleted: bool, deleted_only: bool) -> list[str]:
        with self._locked() as state:
            out = []
            for name in sorted(state.subjects):
                if not name.startswith(prefix):
                    continue
                live = bool(state.versions(name))
                if (deleted_only and not live) or (not deleted_only and (live or deleted)):
                    out.append(name)
            return out

    def versions(self, subject: str, deleted: bool, deleted_only: bool) -> list[int]:
        with self._locked() as state:
            found = state.versions(subject, deleted=deleted or deleted_only)
            if deleted_only:
                found = [v for v in found if v.deleted]
            if not found:
                raise _subject_not_found(subject)
            return [v.version for v in found]

    def version(self, subject: str, version: str, deleted: bool) -> SchemaVersion:
        with self._locked() as state:
            return self._select(self._live(state, subject, deleted), subject, version)

    def register(self, subject: str, req: SchemaRequest) -> SchemaVersion:
        new = self._parse(req)
        with self._locked() as state:
            live = state.versions(subject)
            same = state.find(subject, new)
            if same is not None:
                return same  # identical to an existing version: no new version
            level = self._level(state, subject)
            verdict = self._check(level, new, live)
            if not verdict.ok:
                raise RegistryError(
                    409,
                    409,
                    f"Schema being registered is incompatible with an earlier schema for subject "
                    f'"{subject}" under {level.value}, details: {list(verdict.messages)}',
                )
            schema_id = state.id_for(new) or max(state.max_id, self._burnt_id) + 1
            version = max(state.next_version(subject), self._burnt_versions.get(subject, 0) + 1)
            # stored compact, as Confluent stores its canonical string; key order is kept
            text = json.dumps(json.loads(req.schema_), separators=(",", ":"))
            sv = SchemaVersion(subject, version, schema_id, text)
            self._write(*sv.record())
            log.info("registered %s version %d as id %d", subject, sv.version, sv.id)
            return sv

    def lookup(self, subject: str, req: SchemaRequest, deleted: bool) -> SchemaVersion:
        new = self._parse(req)
        with self._locked() as state:
            self._live(state, subject, deleted=deleted)
            found = state.find(subject, new, deleted=deleted)
            if found is not None:
                return found
            raise _schema_not_found(f"Schema not found under subject '{subject}'")

    def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        with self._locked() as state:
            found = self._live(state, subject, deleted=True)
            live = [v for v in found if not v.deleted]
            if not permanent:
                if not live:
                    raise RegistryError(
                        404,
                        40404,
                        f"Subject '{subject}' was soft deleted. "
                        "Set permanent=true to delete permanently",
                    )
                for v in live:
                    self._write(*replace(v, deleted=True).record())
                if subject in state.configs:  # Confluent drops the subject's level with it
                    self._write(config_key(subject), None)
                return [v.version for v in live]
            if live:
                raise RegistryError(
                    404,
                    40405,
                    f"Subject '{subject}' was not deleted first before being permanently deleted",
                )
            self._remember_max_id(state)
            for v in found:
                self._write(v.record()[0], None)
            return [v.version for v in found]

    def delete_version(self, subject: str, version: str, permanent: bool) -> int:
        with self._locked() as state:
            found = self._live(state, subject, deleted=True)
            if parse_version(version) is None and not permanent:
                found = [v for v in found if not v.deleted]  # "latest" of the live ones
            sv = self._select(found, subject, version)
            if not permanent:
                if sv.deleted:
                    raise RegistryError(
                        404,
                        40406,
                        f"Subject '{subject}' Version {sv.version} was soft deleted. "
                        "Set permanent=true to delete permanently",
                    )
                self._write(*replace(sv, deleted=True).record())
                return sv.version
            if not sv.deleted:
                raise RegistryError(
                    404,
                    40407,
                    f"Subject '{subject}' Version {sv.version} was not deleted first before being "
                    "permanently deleted",
                )
            self._remember_max_id(state)
            self._write(sv.record()[0], None)
            return sv.version

    def _remember_max_id(self, state: RegistryState) -> None:
        self._write(ID_HIGH_WATER_KEY, {"maxId": state.max_id})

    # -- schemas by id -------------------------------------------------------------------
    def schema(self, schema_id: int) -> str:
        with self._locked() as state:
            text = state.schema_text(schema_id)
            if text is None:
                raise _schema_not_found(f"Schema {schema_id} not found")
            return text

    def usages(self, schema_id: int, deleted: bool) -> list[SchemaVersion]:
        with self._locked() as state:
            if state.schema_text(schema_id) is None:
                raise _schema_not_found(f"Schema {schema_id} not found")
            return [v for v in state.usages(schema_id) if deleted or not v.deleted]

    # -- compatibility -------------------------------------------------------------------
    def get_level(self, subject: str | None, default_to_global: bool) -> compat.Level:
        with self._locked() as state:
            level = state.configs.get(subject)
            if level is not None:
                return level
            if subject is None or default_to_global:
                return self._level(state, None)
            raise RegistryError(
                404,
                40408,
                f"Subject '{subject}' does not have subject-level compatibility configured",
            )

    def set_level(self, subject: str | None, body: ConfigUpdate) -> compat.Level:
        unsupported = sorted(k for k, v in (body.model_extra or {}).items() if v is not None)
        if unsupported:
            raise RegistryError(
                422, 42203, f"Unsupported config {unsupported}: only compatibility is stored"
            )
        raw = body.compatibility or body.compatibilityLevel
        if raw is None:
            raise RegistryError(422, 42203, "Missing compatibility level (body: compatibility)")
        try:
            level = compat.Level.parse(raw)
        except ValueError:
            raise _invalid_level(raw) from None
        with self._locked():
            self._write(config_key(subject), {"compatibilityLevel": level.value})
            log.info("compatibility of %s set to %s", subject or "(global)", level.value)
            return level

    def delete_level(self, subject: str | None) -> compat.Level:
        with self._locked() as state:
            old = self.get_level(subject, default_to_global=False)
            if subject is None and None not in state.configs:
                return old  # the default is not stored: nothing to delete
            self._write(config_key(subject), None)
            return old

    def test(self, subject: str, version: str | None, req: SchemaRequest) -> compat.Verdict:
        """`req` against one version (in the level's directions) or as a registration would."""
        new = self._parse(req)
        with self._locked() as state:
            level = self._level(state, subject)
            if version is None:
                against = state.versions(subject)
            else:
                against = [self._select(self._live(state, subject), subject, version)]
            return self._check(level, new, against)


def parse_version(text: str) -> int | None:
    """A version path segment: a number in [1, 2^31-1], or "latest"/-1 (None)."""
    if text.strip().lower() == "latest":
        return None
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number == -1:
        return None
    if not 1 <= number <= MAX_VERSION:
        raise RegistryError(
            422,
            42202,
            f"The specified version '{text}' is not a valid version id. Allowed values are "
            'between [1, 2^31-1] and the string "latest"',
        )
    return number


# -- HTTP ------------------------------------------------------------------------------------


def _registry(request: Request) -> Registry:
    registry: Registry = request.app.state.registry
    return registry


def _subject(subject: Annotated[str, Path()]) -> str:
    # routing runs on the raw path (see _RawPathRouting), whose bytes were read as latin-1
    try:
        raw = subject.encode("latin-1")
    except UnicodeEncodeError:  # a server without raw_path: already decoded
        return subject
    return unquote_to_bytes(raw).decode("utf-8", errors="replace")


RegistryDep = Annotated[Registry, Depends(_registry)]
SubjectDep = Annotated[str, Depends(_subject)]
Flag = Annotated[bool, Query()]

router = APIRouter(default_response_class=RegistryJSONResponse)


def _page(items: list[Any], offset: int, limit: int) -> list[Any]:
    items = items[max(offset, 0) :]
    return items[:limit] if limit >= 0 else items


def _version_body(sv: SchemaVersion) -> SubjectVersionResponse:
    return SubjectVersionResponse(
        subject=sv.subject, version=sv.version, id=sv.id, schema=sv.schema
    )


@router.get("/", tags=["meta"])
def root() -> dict[str, str]:
    return {}


@router.get("/subjects", tags=["subjects"])
def list_subjects(
    registry: RegistryDep,
    subject_prefix: Annotated[str, Query(alias="subjectPrefix")] = "",
    deleted: Flag = False,
    deleted_only: Flag = False,
    offset: int = 0,
    limit: int = -1,
) -> list[str]:
    return _page(registry.subjects(subject_prefix, deleted, deleted_only), offset, limit)


@router.get("/subjects/{subject}/versions", tags=["subjects"])
def list_versions(
    registry: RegistryDep,
    subject: SubjectDep,
    deleted: Flag = False,
    deleted_only: Flag = False,
    offset: int = 0,
    limit: int = -1,
) -> list[int]:
    return _page(registry.versions(subject, deleted, deleted_only), offset, limit)


@router.post("/subjects/{subject}/versions", tags=["subjects"])
def register(
    registry: RegistryDep, subject: SubjectDep, body: SchemaRequest, normalize: Flag = False
) -> RegisterResponse:
    # `normalize` needs no work: identity is always decided on the parsed, canonical form
    sv = registry.register(subject, body)
    return RegisterResponse(id=sv.id, subject=sv.subject, version=sv.version)


@router.post("/subjects/{subject}", tags=["subjects"])
def lookup(
    registry: RegistryDep,
    subject: SubjectDep,
    body: SchemaRequest,
    normalize: Flag = False,
    deleted: Flag = False,
) -> SubjectVersionResponse:
    return _version_body(registry.lookup(subject, body, deleted))


@router.get("/subjects/{subject}/versions/{version}", tags=["subjects"])
def get_version(
    registry: RegistryDep, subject: SubjectDep, version: str, deleted: Flag = False
) -> SubjectVersionResponse:
    return _version_body(registry.version(subject, version, deleted))


@router.get("/subjects/{subject}/versions/{version}/schema", tags=["subjects"])
def get_version_schema(
    registry: RegistryDep, subject: SubjectDep, version: str, deleted: Flag = False
) -> Response:
    text = registry.version(subject, version, deleted).schema
    return Response(content=text, media_type=MEDIA_TYPE)


@router.get("/subjects/{subject}/versions/{version}/referencedby", tags=["subjects"])
def referenced_by(registry: RegistryDep, subject: SubjectDep, version: str) -> list[int]:
    registry.version(subject, version, deleted=False)
    return []  # references are not supported, so nothing refers to anything


@router.delete("/subjects/{subject}", tags=["subjects"])
def delete_subject(
    registry: RegistryDep, subject: SubjectDep, permanent: Flag = False
) -> list[int]:
    return registry.delete_subject(subject, permanent)


@router.delete("/subjects/{subject}/versions/{version}", tags=["subjects"])
def delete_version(
    registry: RegistryDep, subject: SubjectDep, version: str, permanent: Flag = False
) -> int:
    return registry.delete_version(subject, version, permanent)


@router.get("/schemas/types", tags=["schemas"])
def schema_types() -> list[str]:
    return ["AVRO"]


@router.get("/schemas/ids/{schema_id}", tags=["schemas"])
def get_schema(
    registry: RegistryDep,
    schema_id: int,
    subject: str | None = None,
    fmt: Annotated[str | None, Query(alias="format")] = None,
) -> SchemaResponse:
    # `subject` only picks a context in Confluent; this registry has the default context only
    return SchemaResponse(schema=registry.schema(schema_id))


@router.get("/schemas/ids/{schema_id}/schema", tags=["schemas"])
def get_schema_text(registry: RegistryDep, schema_id: int) -> Response:
    return Response(content=registry.schema(schema_id), media_type=MEDIA_TYPE)


@router.get("/schemas/ids/{schema_id}/subjects", tags=["schemas"])
def schema_subjects(registry: RegistryDep, schema_id: int, deleted: Flag = False) -> list[str]:
    return sorted({v.subject for v in registry.usages(schema_id, deleted)})


@router.get("/schemas/ids/{schema_id}/versions", tags=["schemas"])
def schema_versions(
    registry: RegistryDep, schema_id: int, deleted: Flag = False
) -> list[SchemaUsage]:
    return [
        SchemaUsage(subject=v.subject, version=v.version)
        for v in registry.usages(schema_id, deleted)
    ]


@router.get("/config", tags=["config"])
def get_global_config(registry: RegistryDep) -> ConfigResponse:
    return ConfigResponse(compatibilityLevel=registry.get_level(None, True))


@router.put("/config", tags=["config"])
def put_global_config(registry: RegistryDep, body: ConfigUpdate) -> ConfigUpdateResponse:
    return ConfigUpdateResponse(compatibility=registry.set_level(None, body))


@router.delete("/config", tags=["config"])
def delete_global_config(registry: RegistryDep) -> ConfigResponse:
    return ConfigResponse(compatibilityLevel=registry.delete_level(None))


@router.get("/config/{subject}", tags=["config"])
def get_subject_config(
    registry: RegistryDep,
    subject: SubjectDep,
    default_to_global: Annotated[bool, Query(alias="defaultToGlobal")] = False,
) -> ConfigResponse:
    return ConfigResponse(compatibilityLevel=registry.get_level(subject, default_to_global))


@router.put("/config/{subject}", tags=["config"])
def put_subject_config(
    registry: RegistryDep, subject: SubjectDep, body: ConfigUpdate
) -> ConfigUpdateResponse:
    return ConfigUpdateResponse(compatibility=registry.set_level(subject, body))


@router.delete("/config/{subject}", tags=["config"])
def delete_subject_config(registry: RegistryDep, subject: SubjectDep) -> ConfigResponse:
    return ConfigResponse(compatibilityLevel=registry.delete_level(subject))


def _compatibility(
    registry: Registry, subject: str, version: str | None, body: SchemaRequest, verbose: bool
) -> CompatibilityResponse:
    verdict = registry.test(subject, version, body)
    return CompatibilityResponse(
        is_compatible=verdict.ok, messages=list(verdict.messages) if verbose else None
    )


@router.post(
    "/compatibility/subjects/{subject}/versions/{version}",
    tags=["compatibility"],
    response_model_exclude_none=True,
)
def check_against_version(
    registry: RegistryDep,
    subject: SubjectDep,
    version: str,
    body: SchemaRequest,
    normalize: Flag = False,
    verbose: Flag = False,
) -> CompatibilityResponse:
    return _compatibility(registry, subject, version, body, verbose)


@router.post(
    "/compatibility/subjects/{subject}/versions",
    tags=["compatibility"],
    response_model_exclude_none=True,
)
def check_against_level(
    registry: RegistryDep,
    subject: SubjectDep,
    body: SchemaRequest,
    normalize: Flag = False,
    verbose: Flag = False,
) -> CompatibilityResponse:
    return _compatibility(registry, subject, None, body, verbose)


@router.get("/mode", tags=["meta"])
def get_mode() -> ModeResponse:
    return ModeResponse(mode="READWRITE")


@router.get("/contexts", tags=["meta"])
def contexts() -> list[str]:
    return ["."]


@router.get("/associations/resources/{namespace}/{name}", tags=["meta"])
def associations(namespace: str, name: str) -> list[dict[str, Any]]:
    # Clients >= 2.14 ask first; no associations makes them fall back to {topic}-value
    return []


# -- app -------------------------------------------------------------------------------------


class _RawPathRouting:
    """Route on the still-encoded path, as Confluent does: a subject holding '/' arrives as
    %2F and must stay one path segment. Subject parameters are unquoted by `_subject`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw:
            scope = {**scope, "path": raw.decode("latin-1")}
        await self.app(scope, receive, send)


class _BasicAuth:
    """HTTP basic auth on every route, as production's registry runs it (Jetty's JAAS
    PropertyFileLoginModule): no or wrong credentials get 401 and nothing else."""

    def __init__(self, app: ASGIApp, users: Mapping[str, str]) -> None:
        self.app = app
        self.users = dict(users)

    def _allowed(self, header: bytes | None) -> bool:
        if not header or header[:6].lower() != b"basic ":
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True)
        except ValueError:
            return False
        user, sep, password = decoded.partition(b":")
        want = self.users.get(user.decode("utf-8", errors="replace"))
        return bool(sep) and want is not None and hmac.compare_digest(password, want.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._allowed(
            dict(scope["headers"]).get(b"authorization")
        ):
            response = _error(401, 401, "Unauthorized")
            response.headers["WWW-Authenticate"] = f'Basic realm="{registry_contract.REALM}"'
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _error(status: int, code: int, message: str) -> RegistryJSONResponse:
    return RegistryJSONResponse({"error_code": code, "message": message}, status_code=status)


async def _on_registry_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RegistryError)
    return _error(exc.status, exc.code, exc.message)


async def _on_http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return _error(exc.status_code, exc.status_code, f"HTTP {exc.status_code} {exc.detail}")


async def _on_validation_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return _error(400, 400, "Request body is not valid JSON")
    text = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors
    )
    if any(tuple(e.get("loc", ()))[:2] == ("body", "schema") for e in errors):
        return _error(422, 42201, f"Invalid schema: {text}")
    return _error(422, 422, f"Unprocessable request: {text}")


async def _on_unexpected(_request: Request, exc: Exception) -> Response:
    log.exception("unexpected error", exc_info=exc)
    return _error(500, 50001, f"Internal error: {type(exc).__name__}")


def create_app(store: SchemaStore, users: Mapping[str, str] | None = None) -> FastAPI:
    """The registry over `store`; its state is read from the store before the app answers.
    `users` (name -> password): every call must log in as one of them; None: anonymous."""
    registry = Registry(store)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(registry.load)
        yield
        await anyio.to_thread.run_sync(store.close)

    app = FastAPI(
        title="Local schema registry",
        summary="Confluent Schema Registry REST subset for the local stack (Avro only)",
        lifespan=lifespan,
        default_response_class=RegistryJSONResponse,
    )
    app.state.registry = registry
    app.include_router(router)
    app.add_exception_handler(RegistryError, _on_registry_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
    app.add_middleware(_RawPathRouting)
    if users is not None:
        app.add_middleware(_BasicAuth, users=users)  # outermost: refused before any routing
    return app
